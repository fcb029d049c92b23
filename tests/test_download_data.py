"""experiments/download_data.py and envs.hotpotqa_download against a loopback HTTP server
(127.0.0.1 only): files land under their official names, a sha256 mismatch exits 2 and
leaves nothing under the final name, interrupted transfers resume with HTTP Range."""
import hashlib
import http.server
import json
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest

from vermem_jax.envs import hotpotqa
from vermem_jax.envs import hotpotqa_download as dl

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'download_data.py'
TRAIN = hotpotqa.SPLIT_FILES[hotpotqa.TRAIN][0]
DEV = hotpotqa.SPLIT_FILES[hotpotqa.VALIDATION][0]


class _Handler(http.server.BaseHTTPRequestHandler):
  """GET of `server.files[path]`, honouring `Range: bytes=N-` (206 + Content-Range)
  unless `server.ignore_range`; while `server.drops[path]` > 0, a response announces
  its full length, sends `server.drop_after` bytes and closes the connection."""

  def do_GET(self):  # noqa: N802 (http.server's name)
    srv = self.server
    srv.requests.append((self.path, self.headers.get('Range')))
    body = srv.files.get(self.path)
    if body is None:
      self.send_error(404)
      return
    start = 0
    m = re.fullmatch(r'bytes=(\d+)-', self.headers.get('Range') or '')
    if m and not srv.ignore_range:
      start = int(m.group(1))
      if start >= len(body):
        self.send_error(416)
        return
      self.send_response(206)
      self.send_header('Content-Range', f'bytes {start}-{len(body) - 1}/{len(body)}')
    else:
      self.send_response(200)
    rest = body[start:]
    self.send_header('Content-Length', str(len(rest)))
    self.end_headers()
    if srv.drops.get(self.path, 0) > 0:
      srv.drops[self.path] -= 1
      self.wfile.write(rest[:srv.drop_after])
      self.wfile.flush()
      self.close_connection = True
      return
    self.wfile.write(rest)

  def log_message(self, *args):
    pass


@pytest.fixture
def server():
  srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Handler)
  srv.files, srv.requests, srv.drops = {}, [], {}
  srv.drop_after, srv.ignore_range = 0, False
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  srv.url = f'http://127.0.0.1:{srv.server_address[1]}'
  yield srv
  srv.shutdown()
  srv.server_close()


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _payload(n: int, seed: int) -> bytes:
  """n bytes that differ at every offset between seeds (so a misplaced resume shows)."""
  return bytes((i * 31 + seed * 7 + i // 251) % 256 for i in range(n))


def _spec(server, path: str, body: bytes, sha256: str | None = None) -> dl.FileSpec:
  server.files[path] = body
  return dl.FileSpec(url=server.url + path, filename=path.lstrip('/'),
                     sha256=_sha(body) if sha256 is None else sha256)


def _get(spec, dest, **kw):
  kw = {'timeout_s': 10.0, 'chunk_bytes': 4096, 'retries': 0, 'progress': False, **kw}
  return dl.download_file(spec, str(dest), **kw)


def _error_lines(stderr: str) -> list[str]:
  """The script's error lines (the rest of stderr is the progress bar)."""
  return [l for l in stderr.splitlines() if l.startswith('download_data: error:')]


def _run_script(server, data_dir, *extra):
  return subprocess.run(
      [sys.executable, str(SCRIPT), f'--data_dir={data_dir}',
       f'--config.files.train.url={server.url}/{TRAIN}',
       f'--config.files.dev_distractor.url={server.url}/{DEV}', *extra],
      capture_output=True, text=True, timeout=120)


def test_script_fetches_both_files_where_the_loader_finds_them(server, tmp_path, raw_rows):
  train = json.dumps(raw_rows('train')[:3]).encode()
  dev = json.dumps(raw_rows('validation')[:2]).encode()
  server.files = {f'/{TRAIN}': train, f'/{DEV}': dev}
  res = _run_script(server, tmp_path, f'--config.files.train.sha256={_sha(train)}',
                    f'--config.files.dev_distractor.sha256={_sha(dev)}')
  assert res.returncode == 0, res.stderr
  folder = tmp_path / 'hotpotqa'
  assert sorted(os.listdir(folder)) == sorted([TRAIN, DEV])
  assert (folder / TRAIN).read_bytes() == train and (folder / DEV).read_bytes() == dev
  assert hotpotqa.find_split_file('train', str(folder)) == str(folder / TRAIN)
  assert f'--config.data.data_dir={tmp_path}' in res.stdout
  # A second run finds both files verified and fetches nothing.
  n = len(server.requests)
  assert _run_script(server, tmp_path, f'--config.files.train.sha256={_sha(train)}',
                     f'--config.files.dev_distractor.sha256={_sha(dev)}').returncode == 0
  assert len(server.requests) == n


def test_script_sha256_mismatch_exits_2_and_leaves_no_file(server, tmp_path):
  server.files = {f'/{TRAIN}': _payload(5000, 1)}
  res = _run_script(server, tmp_path, '--files=train',
                    f'--config.files.train.sha256={_sha(b"other bytes")}')
  assert res.returncode == 2
  (line,) = _error_lines(res.stderr)
  assert 'does not match' in line and res.stderr.endswith(line + '\n')
  assert os.listdir(tmp_path / 'hotpotqa') == []  # neither the final name nor .part


def test_script_offline_and_unverified_exit_2(server, tmp_path):
  server.shutdown()
  server.server_close()
  res = _run_script(server, tmp_path, '--files=train')
  assert res.returncode == 2
  assert _error_lines(res.stderr) == [res.stderr.strip()] and 'cannot connect' in res.stderr
  res = _run_script(server, tmp_path, '--files=train', '--config.files.train.sha256=')
  assert res.returncode == 2 and '--allow_unverified' in res.stderr
  assert not (tmp_path / 'hotpotqa' / TRAIN).exists()


def test_unverified_download_needs_the_flag(server, tmp_path):
  spec = _spec(server, '/a.json', _payload(300, 2), sha256='')
  with pytest.raises(dl.DownloadError, match='allow_unverified'):
    _get(spec, tmp_path)
  assert _get(spec, tmp_path, allow_unverified=True) == str(tmp_path / 'a.json')
  assert (tmp_path / 'a.json').read_bytes() == server.files['/a.json']


def test_dropped_connection_is_resumed_with_range(server, tmp_path):
  body = _payload(50_000, 3)
  spec = _spec(server, '/f.json', body)
  server.drops['/f.json'], server.drop_after = 1, 12_345
  _get(spec, tmp_path, retries=1)
  assert (tmp_path / 'f.json').read_bytes() == body
  assert not (tmp_path / 'f.json.part').exists()
  assert server.requests == [('/f.json', None), ('/f.json', 'bytes=12345-')]


def test_interrupted_run_keeps_the_part_and_the_next_run_completes(server, tmp_path):
  body = _payload(40_000, 4)
  spec = _spec(server, '/g.json', body)
  server.drops['/g.json'], server.drop_after = 1, 9_000
  with pytest.raises(dl.DownloadError, match='connection dropped'):
    _get(spec, tmp_path, retries=0)
  assert not (tmp_path / 'g.json').exists()
  assert (tmp_path / 'g.json.part').read_bytes() == body[:9_000]
  _get(spec, tmp_path)
  assert (tmp_path / 'g.json').read_bytes() == body
  assert server.requests[-1] == ('/g.json', 'bytes=9000-')


def test_complete_part_and_server_without_range(server, tmp_path):
  body = _payload(10_000, 5)
  spec = _spec(server, '/h.json', body)
  (tmp_path / 'h.json.part').write_bytes(body)  # complete: the server answers 416
  _get(spec, tmp_path)
  assert (tmp_path / 'h.json').read_bytes() == body
  server.ignore_range = True  # 200 with the whole file: the .part restarts at 0
  spec = _spec(server, '/i.json', _payload(10_000, 6))
  (tmp_path / 'i.json.part').write_bytes(b'x' * 700)
  _get(spec, tmp_path)
  assert (tmp_path / 'i.json').read_bytes() == server.files['/i.json']


def test_existing_file_with_other_bytes_is_an_error(server, tmp_path):
  spec = _spec(server, '/j.json', _payload(100, 7))
  (tmp_path / 'j.json').write_bytes(b'old')
  with pytest.raises(dl.DownloadError, match='exists with sha256'):
    _get(spec, tmp_path)
  assert (tmp_path / 'j.json').read_bytes() == b'old' and not server.requests
