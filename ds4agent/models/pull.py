"""Downloading ds4's weights from the Hugging Face Hub (`ds4agent pull`, commands/pull.py).

The Hub's conventions come from huggingface_hub: the file URL (`hf_hub_url`, honouring
HF_ENDPOINT), the file's metadata (`get_hf_file_metadata`: size, ETag, commit), the request
headers and token (`build_hf_headers`: --token, else HF_TOKEN, else the token `hf auth login`
saved under HF_HOME), its HTTP client and error types, and its progress bars. The transfer itself
is done here, because hf_hub_download does not resume these files: it writes each attempt to a
fresh process-unique temp file, starts a plain-HTTP download from zero and leaves the old partial
file behind (measured with huggingface_hub 2.4), and it refuses plain-HTTP files over 50 GB.

So a download goes to `<dir>/<file>.part`, one name per file: an interrupted pull (network, Ctrl+C,
a crash) leaves the bytes it has, and the next pull asks for the rest with an HTTP range request.
The finished file is checked before it gets its real name: its size and the SHA-256 the Hub reports
(the ETag of an LFS file), which huggingface_hub does not check. A mismatch removes the bytes and
says what failed.

Nothing here writes to a terminal: `pull` hands its one-line notes to `report` and its byte counts
to the `progress` bars it opens; the command decides where they go (stderr, tqdm bars).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from ..fsutil import fsync_dir
from . import fit
from .catalog import FLAVOURS, HUB_REPO, HUB_REVISION, RECOMMENDED, Flavour, flavour, human_bytes
from .errors import PullError
from .locate import PART_SUFFIX, model_dir

CHUNK = 1 << 20  # bytes per read when hashing: flat memory
RETRIES = 5  # attempts in a row that bring no new byte before a pull gives up
RETRY_DELAY_S = 2.0  # between attempts after a dropped connection
# A server that keeps the connection open but sends (almost) nothing would hold a pull for ever:
# the HTTP read timeout only fires on total silence, and a byte every few seconds resets it. Less
# than MIN_RATE bytes/s over any STALL_WINDOW_S is a stall: the pull gives up and keeps its bytes.
MIN_RATE = 16 * 1024
STALL_WINDOW_S = 60.0
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ProgressBar(Protocol):
    """What pull needs of a progress bar (tqdm's names): a context manager counting bytes."""

    def __enter__(self) -> ProgressBar: ...
    def __exit__(self, *exc: object) -> None: ...
    def update(self, n: int) -> object: ...
    def reset(self, total: int | None = None) -> object: ...


#: Opens a bar: (description, total bytes, bytes already there) -> ProgressBar.
Progress = Callable[[str, int, int], ProgressBar]


class _NoBar:
    """The bar of a pull that shows none."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        return None

    def reset(self, total: int | None = None) -> None:
        return None


def no_progress(desc: str, total: int, initial: int) -> ProgressBar:
    return _NoBar()


@dataclass(frozen=True)
class RemoteFile:
    url: str
    size: int
    sha256: str | None  # None: the Hub gave no SHA-256 (not an LFS file); only the size is checked
    commit: str | None


def free_bytes(directory: Path) -> int:
    """Free space on the filesystem holding `directory` (a seam for tests)."""
    return shutil.disk_usage(directory).free


def hub_endpoint() -> str:
    """HF_ENDPOINT as it is now: huggingface_hub reads it once, when it is first imported."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _headers(token: str | None) -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    # token=None lets huggingface_hub find one (HF_TOKEN, or the file `hf auth login` wrote).
    headers = build_hf_headers(token=token or None, library_name="ds4agent")
    # Raw bytes only: the size, the ranges and the SHA-256 are all about the file as stored.
    headers["Accept-Encoding"] = "identity"
    return headers


def remote_file(f: Flavour, token: str | None) -> RemoteFile:
    """Ask the Hub about the file (a HEAD request): where it is, how big, its SHA-256."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    endpoint = hub_endpoint()
    url = hf_hub_url(HUB_REPO, f.filename, revision=HUB_REVISION, endpoint=endpoint)
    with _hub_errors(f, token, endpoint):
        meta = get_hf_file_metadata(url, token=token or None, library_name="ds4agent", endpoint=endpoint)
    if meta.size is None:
        raise PullError(f"the Hub did not report the size of {f.filename}; cannot download it safely")
    etag = (meta.etag or "").lower()
    return RemoteFile(url=url, size=int(meta.size), sha256=etag if _SHA256.match(etag) else None,
                      commit=meta.commit_hash)


@contextlib.contextmanager
def _hub_errors(f: Flavour, token: str | None, endpoint: str):
    """huggingface_hub's and the HTTP client's errors, as one sentence that says what to do."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    where = f"{HUB_REPO}/{f.filename}"
    try:
        yield
    except HfHubHTTPError as err:
        code = err.response.status_code if err.response is not None else None
        if code in (401, 403):
            if token or _implicit_token():
                raise PullError(f"the Hub refused the token for {where} (HTTP {code}): check that it "
                                "has read access to the repository") from None
            raise PullError(f"the Hub refused access to {where} (HTTP {code}): a Hugging Face token "
                            "is needed; pass --token TOKEN, set HF_TOKEN, or run `hf auth login`") from None
        if code == 404:
            raise PullError(f"no such file on the Hub: {where} at revision {HUB_REVISION} "
                            f"(HTTP 404 from {endpoint})") from None
        raise PullError(f"the Hub answered HTTP {code} for {where}: {_first_line(err)}") from None
    except (httpx2.HTTPError, ConnectionError) as err:
        raise PullError(f"cannot reach the Hub at {endpoint}: {_first_line(err)}") from None


def _implicit_token() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@dataclass(frozen=True)
class RateFloor:
    """The slowest transfer a pull accepts: at least `min_rate` bytes/s over each `window_s`."""

    min_rate: int = MIN_RATE
    window_s: float = STALL_WINDOW_S


class _RateWatch:
    """Counts the bytes of one response in consecutive windows; raises PullError when a whole
    window brought fewer than the floor asks for."""

    def __init__(self, floor: RateFloor, part_name: str, have: int) -> None:
        self.floor = floor
        self.part_name = part_name
        self.have = have
        self.start = time.monotonic()
        self.got = 0

    def arrived(self, nbytes: int) -> None:
        self.got += nbytes
        self.have += nbytes
        now = time.monotonic()
        elapsed = now - self.start
        if elapsed < self.floor.window_s:
            return
        if self.got < self.floor.min_rate * elapsed:
            raise PullError(f"the server has stalled: {human_bytes(self.got)} in the last {elapsed:.1f} s, "
                            f"less than {human_bytes(self.floor.min_rate)}/s; the {human_bytes(self.have)} "
                            f"downloaded are kept in {self.part_name}: run the same pull again to continue")
        self.start, self.got = now, 0


def pull(name: str, *, directory: str | os.PathLike[str] | None = None, token: str | None = None,
         report: Callable[[str], None] = lambda line: None, progress: Progress = no_progress,
         floor: RateFloor = RateFloor()) -> Path:
    """Download flavour `name` into the model directory (resuming a partial file); return its path.

    `report(line)` gets each note (already downloaded, the RAM warning, what is being fetched);
    `progress` opens the download and verification bars; `floor` is the slowest transfer accepted
    before the pull gives up (tests shorten its window)."""
    f = flavour(name)
    where = model_dir(directory)
    final = where / f.filename
    if final.is_file():
        # Only a verified download is ever renamed to this name. Touching it makes it the newest
        # model, so the default lookup (locate.py) runs what the user pulled last.
        os.utime(final)
        report(f"already downloaded: {f.name}")
        return final
    problem = fit.fit_problem(f.ram_bytes or 0, fit.machine_ram(), what=f.name)
    if problem:
        report(f"warning: {problem}; it will not run on this machine (downloading anyway)")
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PullError(f"cannot create the model directory {where}: {e.strerror or e}") from None
    remote = remote_file(f, token)
    part = where / (f.filename + PART_SUFFIX)
    with _locked(part) as fh:
        have = _usable_part(fh, remote.size)
        need = remote.size - have
        free = free_bytes(where)
        if free < need:
            raise PullError(f"not enough disk space in {where}: {f.filename} needs {human_bytes(need)} "
                            f"more ({human_bytes(remote.size)} in all) and {human_bytes(free)} is free")
        commit = f" @ {remote.commit[:10]}" if remote.commit else ""
        verb = f"resuming at {human_bytes(have)} of" if have else "downloading"
        report(f"{verb} {f.filename} ({human_bytes(remote.size)}) from {HUB_REPO}{commit}")
        _download(remote, fh, have, token, progress, floor, part.name)
        _verify(part, remote, report, progress)
        os.replace(part, final)
    fsync_dir(where)
    if not f.runnable:
        report(f"{f.name} is the optional speculative-decoding part; ds4agent does not use it yet")
    return final


@contextlib.contextmanager
def _locked(part: Path):
    """The partial file, open for appending, held with an exclusive lock: two pulls of one file
    appending to the same bytes would corrupt both. Unbuffered, so the file's size is always
    exactly the bytes written: a retry resumes from that size, and a byte still sitting in a
    buffer would be written again after the resumed ones."""
    fh = open(part, "ab", buffering=0)
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PullError(f"another `ds4agent pull` is downloading {part.name[: -len(PART_SUFFIX)]}; "
                            "wait for it to finish") from None
        try:
            yield fh
        finally:
            # A pull refused before its first byte (disk space, a failed request) leaves no empty
            # partial file behind. Still under the lock, so it is never another pull's file.
            with contextlib.suppress(OSError):
                if os.fstat(fh.fileno()).st_size == 0 and part.exists():
                    part.unlink()
    finally:
        fh.close()


def _usable_part(fh: BinaryIO, size: int) -> int:
    """How many bytes of the partial file to keep: all of them, unless it is longer than the
    file on the Hub (then it is not a prefix of it, and is discarded)."""
    have = os.fstat(fh.fileno()).st_size
    if have > size:
        fh.truncate(0)
        return 0
    return have


def _download(remote: RemoteFile, fh: BinaryIO, have: int, token: str | None, progress: Progress,
              floor: RateFloor, part_name: str) -> None:
    """Append the missing bytes, asking for them with a range request; retry a dropped connection
    from where it stopped."""
    import httpx2

    if have >= remote.size:
        return
    headers = _headers(token)
    stalled = 0  # attempts in a row that failed without a new byte
    with progress("download", remote.size, have) as bar:
        while have < remote.size:
            before = have
            try:
                have = _fetch_rest(remote, fh, have, headers, bar, floor, part_name)
            except httpx2.TransportError as e:
                have = os.fstat(fh.fileno()).st_size
                stalled = 0 if have > before else stalled + 1
                if stalled >= RETRIES:
                    raise PullError(f"the download keeps failing ({_first_line(e)}); {human_bytes(have)} "
                                    "are kept: run the same pull again to continue") from None
                time.sleep(RETRY_DELAY_S)


def _fetch_rest(remote: RemoteFile, fh: BinaryIO, have: int, headers: dict[str, str], bar: ProgressBar,
                floor: RateFloor, part_name: str) -> int:
    from huggingface_hub import get_session
    from huggingface_hub.constants import HF_HUB_DOWNLOAD_TIMEOUT
    from huggingface_hub.utils import hf_raise_for_status

    request = dict(headers)
    if have:
        request["Range"] = f"bytes={have}-"
    # The Hub redirects LFS files to its CDN; the client drops the Authorization header when a
    # redirect leaves the Hub's host.
    with get_session().stream("GET", remote.url, headers=request, follow_redirects=True,
                              timeout=HF_HUB_DOWNLOAD_TIMEOUT) as response:
        with _hub_errors_for_download(remote):
            hf_raise_for_status(response)
        if have and response.status_code != 206:
            # The server ignored the range and sends the whole file: start over rather than
            # append a second copy after the bytes we have.
            fh.truncate(0)
            bar.reset(total=remote.size)
            have = 0
        elif have and not response.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
            raise PullError(f"the server answered a range request for bytes {have}- with "
                            f"{response.headers.get('Content-Range')!r}; not resuming from that")
        announced = response.headers.get("Content-Length")
        if announced is not None and announced.isdigit() and have + int(announced) > remote.size:
            raise PullError(_too_long(remote, have + int(announced)))
        watch = _RateWatch(floor, part_name, have)
        # As the bytes arrive (no fixed-size buffering): when the connection drops, every byte
        # received is already in the file, so the next attempt asks for exactly the rest.
        try:
            for chunk in response.iter_bytes():
                room = remote.size - have
                if len(chunk) > room:
                    # A body longer than the Hub advertised (no Content-Length, or one that lied):
                    # the bytes past the advertised end never reach the file.
                    _write_all(fh, chunk[:room])
                    have += room
                    raise PullError(_too_long(remote, None))
                _write_all(fh, chunk)
                have += len(chunk)
                bar.update(len(chunk))
                watch.arrived(len(chunk))
        finally:
            os.fsync(fh.fileno())
    return have


def _too_long(remote: RemoteFile, claimed: int | None) -> str:
    what = f"announced {claimed} bytes" if claimed is not None else "sent more bytes"
    return (f"the server {what} for a file the Hub says is {remote.size} bytes long; refusing the rest "
            "(nothing past that size was written): run the same pull again later")


def _write_all(fh: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:  # an unbuffered write may take fewer bytes than offered
        view = view[fh.write(view):]


@contextlib.contextmanager
def _hub_errors_for_download(remote: RemoteFile):
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as err:
        code = err.response.status_code if err.response is not None else None
        raise PullError(f"the download of {remote.url} failed with HTTP {code}: {_first_line(err)}") from None


def _verify(part: Path, remote: RemoteFile, report: Callable[[str], None], progress: Progress) -> None:
    """Size, then SHA-256; a file that fails either is removed (its bytes cannot be trusted, and
    resuming after wrong bytes would only append more to them)."""
    size = part.stat().st_size
    if size != remote.size:
        part.unlink()
        raise PullError(f"size check failed for {part.name[: -len(PART_SUFFIX)]}: got {size} bytes, the "
                        f"Hub says {remote.size}; the partial download was removed, run the pull again")
    if remote.sha256 is None:
        report("note: the Hub reports no SHA-256 for this file; only its size was checked")
        return
    digest = hashlib.sha256()
    with open(part, "rb") as fh, progress("verify SHA-256", size, 0) as bar:
        while block := fh.read(CHUNK):
            digest.update(block)
            bar.update(len(block))
    got = digest.hexdigest()
    if got != remote.sha256:
        part.unlink()
        raise PullError(f"SHA-256 check failed for {part.name[: -len(PART_SUFFIX)]}: got {got}, the Hub "
                        f"says {remote.sha256}; the downloaded bytes were removed, run the pull again")


def listing(directory: str | os.PathLike[str] | None = None) -> str:
    """`ds4agent pull` with no name: every flavour, its size and RAM advice, and what is here."""
    where = model_dir(directory)
    width = max(len(f.name) for f in FLAVOURS)
    lines = [f"models in the Hub repository {HUB_REPO}, downloaded into {where}:"]
    for f in FLAVOURS:
        final, part = where / f.filename, where / (f.filename + PART_SUFFIX)
        if final.is_file():
            state = "downloaded"
        elif part.is_file():
            state = f"partial, {human_bytes(part.stat().st_size)} so far"
        else:
            state = ""
        ram = f"RAM {human_bytes(f.ram_bytes)}+" if f.ram_bytes else ""
        lines.append(f"  {f.name:<{width}}  {human_bytes(f.approx_bytes):>6}  {ram:<11}  {f.advice}"
                     + (f"  [{state}]" if state else ""))
    here = fit.machine_ram()
    if here:
        lines.append(f"this machine has {human_bytes(here)} of RAM")
    lines.append(f"download one with: ds4agent pull NAME (e.g. ds4agent pull {RECOMMENDED.name})")
    return "\n".join(lines)
