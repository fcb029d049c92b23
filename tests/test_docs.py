"""The user documentation holds together: README.md is a landing page of at most 250
lines that links every page of docs/, every relative link in README.md and docs/ names a
file that exists, the citation in README.md is the one in CITATION.cff, the endpoint
roles keep one port each, and no comment in experiments/configs/ is a measurement log
(issue 39)."""

import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / 'README.md'
DOCS = ROOT / 'docs'
CONFIGS = ROOT / 'experiments' / 'configs'

MAX_README_LINES = 250
MAX_CONFIG_COMMENT_LINES = 5  # issue 39: "no comment ... longer than five lines"

# [text](target) outside code spans; images and bare URLs are not relative links.
LINK = re.compile(r'(?<!!)\[[^\]]*\]\(([^)\s]+)\)')


def _pages():
  return [README, *sorted(DOCS.glob('*.md'))]


def _prose(text):
  """The text with fenced and indented code blocks and inline code removed."""
  kept, in_fence = [], False
  for line in text.splitlines():
    if line.lstrip().startswith('```'):
      in_fence = not in_fence
      continue
    if in_fence or line.startswith('    '):
      continue
    kept.append(re.sub(r'`[^`]*`', '', line))
  return '\n'.join(kept)


def link_targets(text):
  """The targets of the relative links of a Markdown text, as written: links inside
  code are not links, and external (`https:`, `mailto:`) and same-page (`#x`) ones are
  skipped."""
  return [t for t in LINK.findall(_prose(text))
          if not re.match(r'[a-z][a-z0-9+.-]*:', t) and not t.startswith('#')]


def relative_links(page):
  """(path relative to the repository root, target as written) for every relative link
  of `page`, anchors dropped."""
  out = []
  for target in link_targets(page.read_text()):
    resolved = (page.parent / target.split('#')[0]).resolve()
    out.append((resolved.relative_to(ROOT).as_posix(), target))
  return out


def test_link_targets_on_a_hand_written_page():
  text = ('See [a](a.md#x), [web](https://x.org), [same](#top), `[no](c.md)`,\n'
          '![img](i.png) and [b](../b.md).\n\n    [code](d.md)\n'
          '```\n[fenced](e.md)\n```\n')
  assert link_targets(text) == ['a.md#x', '../b.md']


def test_readme_is_a_landing_page():
  n = len(README.read_text().splitlines())
  assert n <= MAX_README_LINES, f'README.md has {n} lines (at most {MAX_README_LINES})'


def test_readme_links_every_docs_page():
  linked = {path for path, _ in relative_links(README)}
  pages = {p.relative_to(ROOT).as_posix() for p in DOCS.glob('*.md')}
  missing = sorted(pages - linked)
  assert not missing, f'docs pages not linked from README.md: {missing}'


@pytest.mark.parametrize('page', _pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
  broken = [target for path, target in relative_links(page)
            if not (ROOT / path).exists()]
  assert not broken, f'{page.relative_to(ROOT)}: links to missing files {broken}'


def _squash(text):
  return ' '.join(text.split())


def test_readme_citation_matches_citation_cff():
  cff = yaml.safe_load((ROOT / 'CITATION.cff').read_text())
  assert cff['cff-version'] == '1.2.0'
  readme = _squash(README.read_text())
  assert f'title = {{{_squash(cff["title"])}}}' in readme
  (paper,) = cff['references']
  assert _squash(paper['title']) in readme
  assert 'arXiv:2608.03137' in readme
  for author in paper['authors']:
    assert f'{author["family-names"]}, {author["given-names"]}' in readme
  assert cff['license'] == 'Apache-2.0'
  assert 'Apache License' in (ROOT / 'LICENSE').read_text()


# `--config.verifier.base_url=http://host:8001/v1`, `sft.teacher_base_url = '...:8004/v1'`
ENDPOINT = re.compile(r'(verifier|solver|eval\.judge|sft\.teacher)[._]base_url'
                      r"\s*=\s*'?https?://[^:/\s]+:(\d+)")


def endpoint_ports(text):
  """{role: {port, ...}} of every base_url with a port written in `text`."""
  ports = {}
  for role, port in ENDPOINT.findall(text):
    ports.setdefault(role, set()).add(int(port))
  return ports


def test_endpoint_ports_on_a_hand_written_text():
  text = ("--config.verifier.base_url=http://h:8001/v1 c.sft.teacher_base_url = "
          "'http://127.0.0.1:8004/v1' --config.eval.judge.base_url=http://x:8003/v1 "
          "--config.solver.base_url=JUDGE_URL")
  assert endpoint_ports(text) == {'verifier': {8001}, 'sft.teacher': {8004},
                                  'eval.judge': {8003}}


def test_each_endpoint_role_has_one_port_and_no_two_roles_share_one():
  texts = [p.read_text() for p in _pages()]
  texts += [p.read_text() for p in CONFIGS.rglob('*.py')]
  texts.append((ROOT / 'vermem_jax' / 'http_chat.py').read_text())
  ports = {}
  for text in texts:
    for role, found in endpoint_ports(text).items():
      ports.setdefault(role, set()).update(found)
  assert set(ports) == {'verifier', 'solver', 'eval.judge', 'sft.teacher'}, ports
  for role, found in ports.items():
    assert len(found) == 1, f'{role} is shown on several ports: {sorted(found)}'
  used = [p for found in ports.values() for p in found]
  assert len(used) == len(set(used)), ports


def comment_runs(text):
  """(first line number, length) of every run of consecutive `#` comment lines;
  a comment after code on its line is not part of a run."""
  runs, first, n = [], 0, 0
  for i, line in enumerate(text.splitlines() + [''], 1):
    if line.strip().startswith('#'):
      first, n = (first, n + 1) if n else (i, 1)
    elif n:
      runs.append((first, n))
      n = 0
  return runs


def test_comment_runs_on_a_hand_written_file():
  text = 'x = 1  # trailing\n# a\n# b\ny = 2\n  # c\n  # d\n  # e\n'
  assert comment_runs(text) == [(2, 2), (5, 3)]


@pytest.mark.parametrize('path', sorted(CONFIGS.rglob('*.py')),
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_config_comments_are_short(path):
  long = [(line, n) for line, n in comment_runs(path.read_text())
          if n > MAX_CONFIG_COMMENT_LINES]
  assert not long, (f'{path.relative_to(ROOT)}: comment blocks (first line, lines) '
                    f'longer than {MAX_CONFIG_COMMENT_LINES}: {long}; move measurements '
                    'to a docs/ page and link it')
