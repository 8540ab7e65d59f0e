"""`ds4agent pull` against a local stand-in for the Hub (tests/models/hub_server.py): full and
resumed downloads, verification, access errors, disk space. Never touches the network."""

from __future__ import annotations

import fcntl
import hashlib
import os
import random

import pytest

from ds4agent import cli
from ds4agent.models import catalog, fit, locate, pull
from ds4agent.models.errors import PullError

from .hub_server import COMMIT, HubServer, HubState

Q2 = catalog.flavour("q2-imatrix")
DATA = random.Random(7).randbytes(3 * pull.CHUNK + 123)  # several reads, an odd tail


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A stand-in Hub holding the q2-imatrix file; HF_ENDPOINT, HF_HOME and the model directory
    point into tmp; no token from the environment or the user's files."""
    import huggingface_hub.constants as hf_constants

    state = HubState()
    state.add(catalog.HUB_REPO, Q2.filename, DATA)
    with HubServer(state) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        # huggingface_hub read HF_ENDPOINT when first imported, possibly before this test, and its
        # user-agent telemetry fetches a registry from that endpoint: switch that request off
        # (pull.hub_endpoint reads HF_ENDPOINT per call, so the file requests come here).
        monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "DS4AGENT_MODEL"):
            monkeypatch.delenv(name, raising=False)
        # huggingface_hub fixed these paths from HF_HOME at import: keep the user's token file out.
        monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
        monkeypatch.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf" / "stored_tokens"))
        monkeypatch.setenv("DS4AGENT_MODEL_DIR", str(tmp_path / "models"))
        monkeypatch.setattr(pull, "RETRY_DELAY_S", 0)
        monkeypatch.setattr(fit, "machine_ram", lambda: 512 * catalog.GB)
        monkeypatch.chdir(tmp_path)
        yield state, server


def _models(tmp_path):
    return tmp_path / "models"


def test_full_download_is_verified_named_and_becomes_the_default_model(hub, tmp_path, capsys):
    state, _ = hub
    assert cli.main(["pull", "q2-imatrix"]) == 0
    out, err = capsys.readouterr()
    final = _models(tmp_path) / Q2.filename
    assert out.strip().splitlines()[-1] == str(final)  # the path is the last line
    assert final.read_bytes() == DATA
    assert not (_models(tmp_path) / (Q2.filename + ".part")).exists()
    assert f"from {catalog.HUB_REPO} @ {COMMIT[:10]}" in err
    gets = state.gets()
    assert len(gets) == 1 and gets[0].range is None and gets[0].sent == len(DATA)
    assert [s.method for s in state.log] == ["HEAD", "GET"]
    # after one pull, the default lookup finds it from any directory
    assert locate.resolve_model_path(None) == final


def _resumed_at(seen) -> int:
    return int(seen.range.removeprefix("bytes=").removesuffix("-"))


def test_interrupted_pull_keeps_its_bytes_and_the_next_pull_asks_only_for_the_rest(hub, tmp_path, monkeypatch):
    state, _ = hub
    monkeypatch.setattr(pull, "RETRIES", 2)
    cut = pull.CHUNK + 4321
    state.cut_after, state.down_after_cut = cut, True  # the connection drops and stays down
    with pytest.raises(PullError, match=r"keeps failing .* run the same pull again to continue"):
        pull.pull("q2-imatrix")
    part = _models(tmp_path) / (Q2.filename + ".part")
    kept = part.read_bytes()
    # What arrived is kept (the client may not have seen the last bytes before the drop).
    assert 0 < len(kept) <= cut and kept == DATA[: len(kept)]
    assert not (_models(tmp_path) / Q2.filename).exists()
    assert [s.range for s in state.log if s.status == 0] == [f"bytes={len(kept)}-"] * 2  # two retries, no answer

    state.down = False
    final = pull.pull("q2-imatrix")
    assert final.read_bytes() == DATA and not part.exists()
    first, second = state.gets()
    assert (first.range, first.sent) == (None, cut)
    assert second.range == f"bytes={len(kept)}-" and second.status == 206
    assert second.sent == len(DATA) - len(kept)  # only the rest was served


def test_dropped_connection_is_resumed_within_one_pull(hub, tmp_path):
    state, _ = hub
    cut = 2 * pull.CHUNK + 5
    state.cut_after = cut
    final = pull.pull("q2-imatrix")
    assert final.read_bytes() == DATA
    first, second = state.gets()
    assert first.range is None and 0 < _resumed_at(second) <= cut
    assert second.sent == len(DATA) - _resumed_at(second)


def test_sha256_mismatch_removes_the_bytes_and_says_what_failed(hub, tmp_path):
    state, _ = hub
    state.etag_override = "ab" * 32
    with pytest.raises(PullError) as err:
        pull.pull("q2-imatrix")
    text = str(err.value)
    assert "SHA-256 check failed" in text and "ab" * 32 in text and hashlib.sha256(DATA).hexdigest() in text
    assert "removed" in text
    assert list(_models(tmp_path).iterdir()) == []  # neither the file nor a partial one


def test_partial_file_longer_than_the_hub_file_is_discarded(hub, tmp_path):
    state, _ = hub
    part = _models(tmp_path) / (Q2.filename + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * (len(DATA) + 10))
    assert pull.pull("q2-imatrix").read_bytes() == DATA
    assert state.gets()[0].range is None


def test_server_ignoring_the_range_restarts_instead_of_appending(hub, tmp_path):
    state, _ = hub
    state.ignore_range = True
    part = _models(tmp_path) / (Q2.filename + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:1000])
    assert pull.pull("q2-imatrix").read_bytes() == DATA
    (get,) = state.gets()
    assert get.range == "bytes=1000-" and get.status == 200 and get.sent == len(DATA)


def test_missing_token_wrong_token_and_right_token(hub, tmp_path, capsys):
    state, _ = hub
    state.token = "hf_secret"
    assert cli.main(["pull", "q2-imatrix"]) == 1
    err = capsys.readouterr().err
    assert "refused access" in err and "HTTP 401" in err and "--token" in err and "HF_TOKEN" in err
    assert "Traceback" not in err
    with pytest.raises(PullError, match=r"refused the token .*HTTP 401"):
        pull.pull("q2-imatrix", token="hf_wrong")
    assert pull.pull("q2-imatrix", token="hf_secret").read_bytes() == DATA
    assert state.gets()[0].authorization == "Bearer hf_secret"


def test_token_from_hf_token_variable(hub, monkeypatch):
    state, _ = hub
    state.token = "hf_env"
    monkeypatch.setenv("HF_TOKEN", "hf_env")
    assert pull.pull("q2-imatrix").read_bytes() == DATA


def test_file_missing_on_the_hub_is_named(hub, tmp_path):
    with pytest.raises(PullError) as err:
        pull.pull("q4-imatrix")
    text = str(err.value)
    assert "no such file on the Hub" in text and catalog.flavour("q4-imatrix").filename in text
    assert "HTTP 404" in text
    assert not (_models(tmp_path) / (catalog.flavour("q4-imatrix").filename + ".part")).exists()


def test_not_enough_disk_space_is_refused_with_the_numbers_before_downloading(hub, tmp_path, monkeypatch):
    state, _ = hub
    monkeypatch.setattr(pull, "free_bytes", lambda directory: 1000)
    with pytest.raises(PullError) as err:
        pull.pull("q2-imatrix")
    text = str(err.value)
    assert "not enough disk space" in text and str(_models(tmp_path)) in text
    assert f"needs {catalog.human_bytes(len(DATA))} more" in text and "1.0 kB is free" in text
    assert state.gets() == []
    assert list(_models(tmp_path).iterdir()) == []  # no empty partial file left behind


def test_disk_space_counts_only_the_missing_bytes_when_resuming(hub, tmp_path, monkeypatch):
    state, _ = hub
    part = _models(tmp_path) / (Q2.filename + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:-100])
    monkeypatch.setattr(pull, "free_bytes", lambda directory: 100)  # exactly what is left
    assert pull.pull("q2-imatrix").read_bytes() == DATA
    assert state.gets()[0].sent == 100


def test_cdn_redirect_keeps_the_token_on_the_hub_and_ranges_work(tmp_path, monkeypatch, hub):
    state, _ = hub
    cdn_state = HubState(files=dict(state.files), token="hf_secret")
    with HubServer(cdn_state, cdn=True) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        cdn_state.cut_after = pull.CHUNK
        assert pull.pull("q2-imatrix", token="hf_secret").read_bytes() == DATA
    hub_requests = [s for s in cdn_state.log if "/resolve/" in s.path]
    cdn_requests = [s for s in cdn_state.log if s.path.startswith("/cdn/")]
    assert {s.status for s in hub_requests} == {302}
    assert all(s.authorization == "Bearer hf_secret" for s in hub_requests)
    assert [s.authorization for s in cdn_requests] == [None, None]  # the token never left the Hub
    assert cdn_requests[0].range is None and 0 < _resumed_at(cdn_requests[1]) <= pull.CHUNK


def test_already_downloaded_makes_no_request_and_becomes_the_newest(hub, tmp_path):
    state, _ = hub
    final = pull.pull("q2-imatrix")
    other = _models(tmp_path) / catalog.flavour("q4").filename
    other.write_bytes(b"x")
    os.utime(final, (1000, 1000))
    assert locate.resolve_model_path(None) == other
    n = len(state.log)
    notes: list[str] = []
    assert pull.pull("q2-imatrix", report=notes.append) == final
    assert len(state.log) == n and notes == ["already downloaded: q2-imatrix"]
    assert locate.resolve_model_path(None) == final


def test_concurrent_pull_of_the_same_file_is_refused(hub, tmp_path):
    part = _models(tmp_path) / (Q2.filename + ".part")
    part.parent.mkdir(parents=True)
    with open(part, "ab") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(PullError, match="another `ds4agent pull` is downloading"):
            pull.pull("q2-imatrix")


def test_ram_below_the_flavours_need_asks_before_downloading(hub, monkeypatch, tmp_path):
    monkeypatch.setattr(fit, "machine_ram", lambda: 64 * catalog.GB)
    asked: list[str] = []
    with pytest.raises(PullError, match="^not downloaded: q2-imatrix needs about 96 GB of memory and this "
                       "machine has 64 GB of RAM; it will not run on this machine \\(pass --yes"):
        pull.pull("q2-imatrix", confirm=lambda problem: asked.append(problem) or False)
    assert asked == ["q2-imatrix needs about 96 GB of memory and this machine has 64 GB of RAM; it will not "
                     "run on this machine"]
    assert not list(_models(tmp_path).glob("*.gguf*"))  # nothing was written
    assert pull.pull("q2-imatrix", confirm=lambda problem: True).read_bytes() == DATA


def test_mtp_is_downloaded_with_a_note_that_it_is_not_used(hub):
    state, _ = hub
    mtp = catalog.flavour("mtp")
    state.add(catalog.HUB_REPO, mtp.filename, b"mtp bytes")
    notes: list[str] = []
    assert pull.pull("mtp", report=notes.append).read_bytes() == b"mtp bytes"
    assert "does not use it yet" in notes[-1]


def test_listing_shows_sizes_ram_and_what_is_here(hub, tmp_path, capsys):
    models = _models(tmp_path)
    models.mkdir()
    (models / Q2.filename).write_bytes(b"x")
    (models / (catalog.flavour("q4").filename + ".part")).write_bytes(b"y" * 2000)
    assert cli.main(["pull"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(lines) == {f.name for f in catalog.FLAVOURS}
    assert "81 GB" in lines["q2-imatrix"] and "RAM 96 GB+" in lines["q2-imatrix"] and "[downloaded]" in lines["q2-imatrix"]
    assert "153 GB" in lines["q4-imatrix"] and "RAM 256 GB+" in lines["q4-imatrix"]
    assert "[partial, 2.0 kB so far]" in lines["q4"] and "not used" in lines["mtp"]
    assert str(models) in out and "ds4agent pull q2-imatrix" in out


def test_unknown_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["pull", "q9"])
    assert exit_.value.code == 2 and "invalid choice: 'q9'" in capsys.readouterr().err


def test_disk_full_while_writing_is_one_line_and_keeps_the_bytes(hub, tmp_path, monkeypatch, capsys):
    state, _ = hub
    written = []

    def full_disk(fh, data):
        if written:
            raise OSError(28, "No space left on device")
        written.append(len(data))
        fh.write(data)

    monkeypatch.setattr(pull, "_write_all", full_disk)
    assert cli.main(["pull", "q2-imatrix"]) == 1
    err = capsys.readouterr().err
    assert "pull failed: No space left on device" in err and "Traceback" not in err
    part = _models(tmp_path) / (Q2.filename + ".part")
    assert part.read_bytes() == DATA[: written[0]]


def test_dir_flag_wins_and_the_last_line_is_an_absolute_path(hub, tmp_path, capsys):
    assert cli.main(["pull", "q2-imatrix", "--dir", "elsewhere"]) == 0  # relative to the cwd (tmp_path)
    final = tmp_path / "elsewhere" / Q2.filename
    assert capsys.readouterr().out.splitlines()[-1] == str(final)
    assert final.read_bytes() == DATA and not _models(tmp_path).exists()


# Hostile servers: a body longer than the size the Hub advertised never reaches the disk past that
# size, and a server that drips bytes too slowly is given up on with its bytes kept for the resume.

# 4 MiB/s over 1 s: a dripping answer fails it at its first byte after a second, while the fast part
# before the drip (1 MiB) has a whole second to arrive even on a machine loaded by other tests.
FAST_FLOOR = pull.RateFloor(min_rate=4 << 20, window_s=1.0)


def _part(tmp_path):
    return _models(tmp_path) / (Q2.filename + ".part")


def test_an_announced_overlong_body_is_refused_before_any_byte_is_written(hub, tmp_path):
    state, _ = hub
    state.overlong = b"EXTRA" * 100
    with pytest.raises(PullError, match=rf"announced {len(DATA) + 500} bytes for a file the Hub says is "
                                        rf"{len(DATA)} bytes long"):
        pull.pull("q2-imatrix")
    assert not _part(tmp_path).exists() and not (_models(tmp_path) / Q2.filename).exists()


def test_an_unannounced_overlong_body_is_cut_at_the_advertised_size(hub, tmp_path):
    state, _ = hub
    state.overlong, state.overlong_unannounced = b"EXTRA" * 100, True
    with pytest.raises(PullError, match=r"sent more bytes for a file the Hub says is .*nothing past that size"):
        pull.pull("q2-imatrix")
    kept = _part(tmp_path).read_bytes()
    assert len(kept) <= len(DATA) and kept == DATA[: len(kept)]  # the excess never reached the disk
    # A well-behaved server afterwards: the pull finishes and verifies.
    state.overlong = b""
    assert pull.pull("q2-imatrix").read_bytes() == DATA


def test_a_stalling_server_is_given_up_on_and_the_bytes_are_kept_for_the_resume(hub, tmp_path):
    state, _ = hub
    fast = pull.CHUNK + 777
    state.stall_after, state.drip_s = fast, 0.02  # then ~50 bytes/s, far under the floor
    with pytest.raises(PullError, match=r"the server has stalled: [\d.]+ [kM]?B in the last \d+\.\d s, less than 4\.2 MB/s; "
                                        r"the .* downloaded are kept in .*\.part: run the same pull again"):
        pull.pull("q2-imatrix", floor=FAST_FLOOR)
    kept = _part(tmp_path).read_bytes()
    assert fast <= len(kept) < len(DATA) and kept == DATA[: len(kept)]
    # The resume runs under the default floor: the test floor is there to provoke the stall, and a
    # well-behaved local server on a loaded machine should not have to beat it.
    final = pull.pull("q2-imatrix")
    assert final.read_bytes() == DATA and not _part(tmp_path).exists()
    # The resume asked only for the rest (the dripping answer is logged when its thread ends).
    assert [_resumed_at(s) for s in state.gets() if s.range] == [len(kept)]
