"""The project's own import graph (docs/architecture.md, "Layout"), read with `ast`.

Checks, over every module of vermem_jax/:
  * no import cycle between modules, nor between packages (a package-level cycle is
    a climb back up the layers);
  * no `import vermem_jax...` / `from vermem_jax...` inside a function: an import is
    either a module-level dependency or it is not one (third-party imports deferred
    for an optional or slow dependency are not the target and are not checked);
  * no module imports a private (`_name`) function, class or constant of another
    project module, by `from ... import _name` or through `module._name`;
  * no module re-exports a name it only imports (`name = other_module.name` at module
    level): callers import a name from the module that defines it;
  * the packages import each other only downwards in `LAYERS`;
and that every `vermem_jax/...py` path and `vermem_jax.<module>` name in
docs/architecture.md exists.
"""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'vermem_jax'
ARCHITECTURE = ROOT / 'docs' / 'architecture.md'

# Top to bottom: a unit may import only units on a lower line (or itself). A unit is a
# subpackage of vermem_jax or one of its top-level modules (docs/architecture.md).
LAYERS = (
    ('eval',),
    ('train',),
    ('rl',),
    ('verifiers', 'tokenizer_build'),
    ('envs',),
    ('models', 'tokenization', 'http_chat'),
    ('memory', 'config_util', 'paths'),
)

def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix('').parts)
  if parts[-1] == '__init__':
    parts = parts[:-1]
  return '.'.join(parts)


def _modules() -> dict[str, ast.Module]:
  return {_module_name(p): ast.parse(p.read_text(), filename=str(p))
          for p in sorted(PACKAGE.rglob('*.py'))}


MODULES = _modules()


def _targets(node, importer: str) -> list[str]:
  """The project modules an import statement loads (a name imported from a package
  that is a submodule counts as that submodule)."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names if a.name.split('.')[0] == 'vermem_jax']
  base = node.module or ''
  if node.level:  # relative: resolve against the importer's package
    pkg = importer.split('.')
    if importer not in MODULES or not (PACKAGE / '/'.join(pkg[1:]) / '__init__.py').exists():
      pkg = pkg[:-1]
    pkg = pkg[:len(pkg) - (node.level - 1)]
    base = '.'.join(pkg + ([base] if base else []))
  if base.split('.')[0] != 'vermem_jax':
    return []
  out = []
  for a in node.names:
    sub = f'{base}.{a.name}'
    out.append(sub if sub in MODULES else base)
  return out


def _walk(node, in_function=False):
  """(statement, inside a function?) for every import statement under `node`."""
  for child in ast.iter_child_nodes(node):
    inside = in_function or isinstance(
        child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    if isinstance(child, (ast.Import, ast.ImportFrom)):
      yield child, in_function
    yield from _walk(child, inside)


def _edges() -> dict[str, set[str]]:
  edges = {m: set() for m in MODULES}
  for name, tree in MODULES.items():
    for node, in_function in _walk(tree):
      if not in_function:
        edges[name].update(t for t in _targets(node, name) if t != name)
  return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one node (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return out


def _unit(module: str) -> str:
  """The layer unit of a module: its subpackage, or the top-level module itself."""
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else ''


def _package_edges(edges):
  out = {}
  for src, dsts in edges.items():
    for dst in dsts:
      a, b = _unit(src), _unit(dst)
      if a and b and a != b:
        out.setdefault(a, set()).add(b)
  return out


def test_graph_is_read():
  edges = _edges()
  # A few known edges: if these vanish the reader is broken, not the code fixed.
  assert 'vermem_jax.memory.state' in edges['vermem_jax.memory.executor']
  assert 'vermem_jax.envs.answer_metrics' in edges['vermem_jax.rl.rewards']
  assert sum(map(len, edges.values())) > 300


def test_cycle_finder_finds_a_cycle():
  assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
  assert _cycles({'a': {'b'}, 'b': set()}) == []


def test_no_module_cycles():
  assert _cycles(_edges()) == []


def test_no_package_cycles():
  assert _cycles(_package_edges(_edges())) == []


def test_packages_import_only_downwards():
  rank = {unit: i for i, line in enumerate(LAYERS) for unit in line}
  units = {_unit(m) for m in MODULES} - {''}
  assert units == set(rank), 'LAYERS must name every unit of vermem_jax'
  upward = sorted((a, b) for a, bs in _package_edges(_edges()).items() for b in bs
                  if rank[b] <= rank[a])
  assert upward == []


def test_no_function_level_project_imports():
  found = [f'{name}:{node.lineno}: {ast.unparse(node)}'
           for name, tree in MODULES.items()
           for node, in_function in _walk(tree)
           if in_function and (_targets(node, name) or getattr(node, 'level', 0))]
  assert found == []


def _module_aliases(name: str, tree: ast.Module,
                    found: list[str] | None = None) -> dict[str, str]:
  """{local name: project module} of the modules `name` imports; a private name
  imported with `from ... import _name` is added to `found`."""
  aliases = {}
  for node, _ in _walk(tree):
    if isinstance(node, ast.ImportFrom):
      for a, target in zip(node.names, _targets(node, name)):
        if target == f'{node.module}.{a.name}':
          aliases[a.asname or a.name] = target
        elif (found is not None and a.name.startswith('_')
              and not a.name.startswith('__')):
          found.append(f'{name}:{node.lineno}: {ast.unparse(node)}')
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.name in MODULES:
          aliases[a.asname or a.name] = a.name
  return aliases


def _reexports(name: str, tree: ast.Module) -> list[str]:
  """Module-level `x = module.attr` lines of `name` whose `module` is a project module
  it imports (a name handed on, not defined)."""
  aliases = _module_aliases(name, tree)
  out = []
  for node in tree.body:
    if (isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
        and isinstance(node.value, ast.Attribute)
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id in aliases):
      out.append(f'{name}:{node.lineno}: {ast.unparse(node)}')
  return out


def test_reexport_finder_finds_one():
  tree = ast.parse('from vermem_jax.train import optim\n'
                   'Config = optim.OptimizerConfig\n'
                   'LIMIT = 3\n'
                   'def f():\n  g = optim.lr_schedule\n')
  assert _reexports('vermem_jax.train.x', tree) == [
      'vermem_jax.train.x:2: Config = optim.OptimizerConfig']


def test_no_reexported_names():
  found = [line for name, tree in MODULES.items() for line in _reexports(name, tree)]
  assert found == []


def test_no_private_names_across_modules():
  found = []
  for name, tree in MODULES.items():
    aliases = _module_aliases(name, tree, found)
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and aliases.get(node.value.id, name) != name
          and node.attr.startswith('_') and not node.attr.startswith('__')):
        found.append(f'{name}:{node.lineno}: {node.value.id}.{node.attr}')
  assert found == []


def _named_in_docs(text: str) -> tuple[set[str], set[str]]:
  """(vermem_jax/...py paths, vermem_jax.dotted names) that `text` names."""
  paths = set(re.findall(r'\b(vermem_jax/[\w/]*\w\.py)\b', text))
  modules = set(re.findall(r'\bvermem_jax(?:\.\w+)+', text))
  return paths, modules


def test_architecture_doc_names_only_existing_modules():
  paths, modules = _named_in_docs(ARCHITECTURE.read_text())
  assert len(paths) + len(modules) > 20  # the doc names the modules it describes
  missing = sorted(p for p in paths if not (ROOT / p).is_file())
  missing += sorted(m for m in modules if m not in MODULES
                    # vermem_jax.pkg.module.attribute: the module must exist
                    and m.rsplit('.', 1)[0] not in MODULES)
  assert missing == []


def test_architecture_doc_names_every_package():
  text = ARCHITECTURE.read_text()
  for unit in sorted({_unit(m) for m in MODULES} - {''}):
    is_package = (PACKAGE / unit / '__init__.py').exists()
    assert (f'vermem_jax/{unit}/' if is_package else f'vermem_jax/{unit}.py') in text, unit


def test_doc_reader():
  assert _named_in_docs('see `vermem_jax/rl/grpo.py`, vermem_jax.rl.batching. and '
                        'vermem_jax/eval/ (a folder)') == (
                            {'vermem_jax/rl/grpo.py'}, {'vermem_jax.rl.batching'})
