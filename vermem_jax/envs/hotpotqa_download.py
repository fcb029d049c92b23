"""Fetching the official HotpotQA files over HTTP: resumable, sha256-verified.

`experiments/download_data.py` (config `experiments/configs/download/hotpotqa.py`) calls
`download_file` once per file; docs/data.md is the user guide. A download goes to
`<dest>.part` and is renamed to `<dest>` only after its sha256 matched, so the final
name never holds a partial or corrupt file. An existing `.part` is continued with an
HTTP Range request (a server that ignores Range restarts it from byte 0), and a
connection that drops mid-file is resumed the same way up to `retries` times.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.request

import tqdm

PART_SUFFIX = ".part"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class DownloadError(Exception):
  """A download that cannot complete; the message is one line naming the file and the
  cause (offline, HTTP status, interrupted, sha256 mismatch)."""


class _Interrupted(Exception):
  """The connection dropped mid-file (the `.part` file keeps what arrived)."""


@dataclasses.dataclass(frozen=True)
class FileSpec:
  """One file to fetch.

  Attributes:
    url: http(s) URL of the file.
    filename: name under the destination folder (e.g. `hotpot_train_v1.1.json`).
    sha256: expected lowercase hex digest; '' = unknown (the file is then accepted
      unverified, which callers must allow explicitly).
  """
  url: str
  filename: str
  sha256: str


def file_sha256(path: str, chunk_bytes: int = 1 << 20) -> str:
  """Lowercase hex sha256 of a file's bytes."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(chunk_bytes), b""):
      h.update(block)
  return h.hexdigest()


def _open(url: str, start: int, timeout_s: float):
  """The HTTP response for `url` from byte `start` (a Range request when start > 0);
  None when the server says the range starts at the end (the `.part` is complete)."""
  headers = {"Range": f"bytes={start}-"} if start else {}
  try:
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                  timeout=timeout_s)
  except urllib.error.HTTPError as e:
    if e.code == 416 and start:  # Range Not Satisfiable: nothing left to fetch
      return None
    raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from e
  except (urllib.error.URLError, OSError) as e:
    reason = getattr(e, "reason", e)
    raise DownloadError(f"{url}: cannot connect ({reason}); offline, or a wrong URL "
                        "(override it with --config.files.<name>.url)") from e


def _resume_offset(response, start: int) -> int:
  """Where the body of `response` starts in the file: `start` for a 206 whose
  Content-Range begins there, else 0 (the server sent the whole file)."""
  if not start or response.status != 206:
    return 0
  m = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
  return start if m and int(m.group(1)) == start else 0


def _fetch_into(spec: FileSpec, part: str, *, timeout_s: float, chunk_bytes: int,
                progress: bool) -> None:
  """Appends the rest of `spec.url` to `part` (from its current size). Raises
  _Interrupted when the connection drops, DownloadError when it cannot start."""
  start = os.path.getsize(part) if os.path.exists(part) else 0
  response = _open(spec.url, start, timeout_s)
  if response is None:
    return
  with response:
    offset = _resume_offset(response, start)
    length = response.headers.get("Content-Length")
    total = offset + int(length) if length and length.isdigit() else None
    with open(part, "ab" if offset else "wb") as out, tqdm.tqdm(
        total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
        desc=spec.filename, disable=not progress) as bar:
      written = offset
      try:
        for block in iter(lambda: response.read(chunk_bytes), b""):
          out.write(block)
          written += len(block)
          bar.update(len(block))
      except (http.client.HTTPException, OSError) as e:
        raise _Interrupted(f"after {written} bytes ({e})") from e
      if total is not None and written < total:
        raise _Interrupted(f"after {written} of {total} bytes")


def download_file(spec: FileSpec, dest_dir: str, *, timeout_s: float, chunk_bytes: int,
                  retries: int, allow_unverified: bool = False,
                  progress: bool = True) -> str:
  """Fetches `spec` to `<dest_dir>/<spec.filename>` and returns that path.

  A file already there is kept when its sha256 matches (or, unverified, as it is). The
  bytes go to `<path>.part` first: an existing `.part` is resumed, a dropped connection
  is resumed up to `retries` times, and the `.part` becomes `<path>` only after the
  sha256 check.

  Args:
    spec: the URL, file name and expected sha256.
    dest_dir: destination folder (created if missing).
    timeout_s: seconds a connect or a read may block.
    chunk_bytes: bytes read per call (the progress bar's step).
    retries: how many times an interrupted transfer is resumed before giving up.
    allow_unverified: accept a spec with no sha256 (the file cannot be checked).
    progress: show a tqdm progress bar (stderr).

  Raises:
    DownloadError: no sha256 and not `allow_unverified`; cannot connect (offline, bad
      host) or an HTTP error status; still interrupted after `retries` resumptions (the
      `.part` is kept for the next run); a sha256 mismatch (the `.part` is removed, and
      nothing is written under the final name); an existing final file with another
      sha256.
  """
  if not spec.sha256 and not allow_unverified:
    raise DownloadError(f"{spec.filename}: no sha256 configured, so the download cannot "
                        "be verified; set --config.files.<name>.sha256 or pass "
                        "--allow_unverified")
  path = os.path.join(dest_dir, spec.filename)
  if os.path.isfile(path):
    if not spec.sha256:
      return path
    digest = file_sha256(path, chunk_bytes)
    if digest == spec.sha256:
      return path
    raise DownloadError(f"{path} exists with sha256 {digest}, expected {spec.sha256}; "
                        "remove it to download it again")
  os.makedirs(dest_dir, exist_ok=True)
  part = path + PART_SUFFIX
  for attempt in range(retries + 1):
    try:
      _fetch_into(spec, part, timeout_s=timeout_s, chunk_bytes=chunk_bytes,
                  progress=progress)
      break
    except _Interrupted as e:
      if attempt == retries:
        raise DownloadError(f"{spec.url}: connection dropped {e}, {retries + 1} tries; "
                            f"run again to resume from {part}") from e
  if spec.sha256:
    digest = file_sha256(part, chunk_bytes)
    if digest != spec.sha256:
      os.remove(part)
      raise DownloadError(f"{spec.url}: sha256 {digest} does not match the expected "
                          f"{spec.sha256}; the partial file was removed")
  os.replace(part, path)
  return path
