"""The W&B side of a rendered study (mtad.paper.wandb_publish), offline: the analysis run's
folder holds every table and image, re-rendering keeps one analysis run, the report definition,
``report.md`` and ``PUBLISH.md`` are written, and no network call is attempted.

Everything W&B-facing runs once, in a subprocess (this file run as a script, see ``_main``), so
that the no-network check watches exactly the run the other tests inspect and the pytest process
never starts wandb-core. Run alone: ``pytest tests/test_paper_wandb.py`` (about 5 s).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDY, PROFILE = "smoke_main", "smoke"
HARNESS_RUN_ID = "h4rn3ss0"  # a harness run whose offline folder lies beside the analysis run
ENTITY = "mtad-team"  # an entity set offline must not make the report ask the server
CLAIM = "MTAD is 1.42x faster than speculative sampling"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


# --------------------------------------------------------------------------------------------
# helpers (also used by the subprocess)


def synthetic_rendered(root: Path) -> Any:
    """A small Rendered: two display tables (one with column groups and a "not run" cell), one
    numeric table, one figure (PNG + PDF), ratios, one claim."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    from mtad.paper.rendered import Rendered

    figures = root / "out" / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(2, 2), dpi=50)
    ax.plot([0.1, 0.5, 0.9], [1.2, 1.5, 1.7], marker="o")
    ax.set_xlabel("tau")
    ax.set_ylabel("speed-up vs AR (x)")
    png = figures / "ablation_tau.png"
    fig.savefig(png)
    fig.savefig(png.with_suffix(".pdf"))
    plt.close(fig)

    groups = pd.MultiIndex.from_tuples([("humaneval", "pass@1"), ("humaneval", "speed-up vs AR")])
    main = pd.DataFrame(
        [["0.12 ± 0.01 (n=2)", "1.00"], ["0.15 ± 0.02 (n=2)", "1.42 ± 0.03 (n=2)"]],
        index=pd.Index(["ar", "mtad"], name="method"),
        columns=groups,
    )
    energy = pd.DataFrame(
        {"method": ["sps", "mtad"], "J/token": ["2.00 ± 0.10 (n=2)", "not run: no GPU"]}
    )
    numeric = pd.DataFrame(
        {
            "pair": ["tiny", "tiny"],
            "task": ["prompts", "prompts"],
            "method": ["ar", "mtad"],
            "metric": ["ms_per_token", "ms_per_token"],
            "mean": [10.0, 7.0],
            "std": [0.1, np.nan],
            "n": [2, 2],
        }
    )
    ratios = pd.DataFrame(
        {
            "pair": ["tiny", "tiny"],
            "task": ["prompts", "prompts"],
            "method": ["sps", "mtad"],
            "speedup_vs_ar": [1.1, 1.4],
            "speedup_vs_sps": [1.0, 1.27],
            "energy_ratio_vs_sps": [1.0, 0.8],
            "ppl_change_vs_ar": [0.0, -0.2],
            "score_change_vs_ar": [np.nan, 0.1],
        }
    )
    claims = pd.DataFrame(
        {
            "claim": [CLAIM],
            "source": ["arXiv v2"],
            "paper": ["1.42x"],
            "where": ["tiny/prompts"],
            "ours": ["1.27x [1.20x, 1.34x] (12 x 3)"],
            "verdict": ["holds"],  # what mtad.paper.render.claims_table writes
        }
    )
    return Rendered(
        study=STUDY,
        profile=PROFILE,
        out_dir=root / "out",
        tables={"main": main, "energy": energy},
        numeric={"main": numeric},
        figures={"ablation_tau": png},
        ratios=ratios,
        claims=claims,
        markdown=f"# {STUDY}\n\n" + main.to_markdown(),
        run_ids=[HARNESS_RUN_ID],
        commands=[f"python scripts/reproduce.py main --profile {PROFILE}"],
    )


def read_wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a ``run-<id>.wandb`` file.

    The file is W&B's LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of
    chunks with a 7-byte header: CRC32, little-endian length, type FULL/FIRST/MIDDLE/LAST);
    each record is a ``wandb_internal_pb2.Record``. wandb 0.31 ships no Python reader.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, partial, chunks = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # block trailer too short for a header: padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        elif kind == 4:
            chunks.append(partial + chunk)
            partial = b""
    records = []
    for chunk in chunks:
        record = pb.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


def _items(record: Any) -> dict[str, Any]:
    kind = record.WhichOneof("record_type")
    items = record.history.item if kind == "history" else record.summary.update
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}


def install_network_guard(log: Path, setattr_: Callable[[Any, str, Any], None]) -> None:
    """Make every non-local network attempt of this Python process fail, and record it in
    ``log`` first (a library that swallows the error cannot hide it).

    Guarded: ``socket.getaddrinfo`` for a name that is not this machine,
    ``socket.create_connection`` and ``socket.socket.connect``/``connect_ex`` to an address
    that is not loopback. Unix sockets and loopback stay allowed: wandb talks to its own
    wandb-core process through them.
    """
    local_names = {"localhost", "", socket.gethostname()}

    def local(host: Any) -> bool:
        if host is None:
            return True
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name in local_names:
            return True
        try:
            return ipaddress.ip_address(name.split("%")[0]).is_loopback
        except ValueError:
            return False

    def refuse(what: str, target: Any) -> None:
        with open(log, "a") as fh:
            fh.write(f"{what} {target!r}\n")
        raise OSError(f"network guard: {what} {target!r}")

    real_getaddrinfo = socket.getaddrinfo
    real_create = socket.create_connection
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not local(host):
            refuse("getaddrinfo", host)
        return real_getaddrinfo(host, *args, **kwargs)

    def create_connection(address: Any, *args: Any, **kwargs: Any) -> Any:
        if not local(address[0]):
            refuse("create_connection", address)
        return real_create(address, *args, **kwargs)

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not local(address[0]):
            refuse("connect", address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not local(address[0]):
            refuse("connect_ex", address)
        return real_connect_ex(self, address)

    setattr_(socket, "getaddrinfo", getaddrinfo)
    setattr_(socket, "create_connection", create_connection)
    setattr_(socket.socket, "connect", connect)
    setattr_(socket.socket, "connect_ex", connect_ex)


@contextmanager
def connection_counter() -> Iterator[dict[str, Any]]:
    """A TCP listener on 127.0.0.1 that accepts, records the first bytes and closes every
    connection: pointed at by the proxy variables, it sees any HTTP(S) request a client makes
    through the environment's proxy, from Python or from wandb-core (Go's net/http)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.05)  # close() does not wake a blocked accept(): poll a stop flag
    state: dict[str, Any] = {"port": server.getsockname()[1], "requests": []}
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    state["requests"].append(conn.recv(256))
                except OSError:
                    state["requests"].append(b"")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def _proxy_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
    env.update({k: f"http://127.0.0.1:{port}" for k in PROXY_VARS})
    return env


def _main(root: Path, guard_log: Path) -> None:
    """The subprocess: render twice, then write the report (the renderer's calls)."""
    install_network_guard(guard_log, setattr)
    from mtad.paper import wandb_publish as wp

    rendered = synthetic_rendered(root)
    harness = root / "wandb" / f"offline-run-20260101_000000-{HARNESS_RUN_ID}"
    harness.mkdir(parents=True)
    (harness / f"run-{HARNESS_RUN_ID}.wandb").write_bytes(b"")
    t0 = time.perf_counter()
    first = wp.log_analysis_run(rendered, project="mtad", entity=ENTITY, mode="offline", dir=root)
    t1 = time.perf_counter()
    second = wp.log_analysis_run(rendered, project="mtad", entity=ENTITY, mode="offline", dir=root)
    t2 = time.perf_counter()
    written = wp.write_report(
        rendered, project="mtad", entity=ENTITY, wandb_dir=root, analysis=second
    )
    t3 = time.perf_counter()
    result = {
        "first": first,
        "second": second,
        "written": written,
        "seconds": {"log_first": t1 - t0, "log_second": t2 - t1, "report": t3 - t2},
    }
    (root / "result.json").write_text(json.dumps(result, indent=1))


# --------------------------------------------------------------------------------------------
# the run everything below inspects


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("wandb_publish")
    guard_log = root / "guard.log"
    guard_log.write_text("")
    with connection_counter() as proxy:
        env = _proxy_env(proxy["port"])
        env.update(
            WANDB_MODE="offline",
            PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
            WANDB_SILENT="true",
        )
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, str(root), str(guard_log)],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
        )
        wall = time.perf_counter() - t0
        time.sleep(0.2)  # a late connection would still be counted
        requests = list(proxy["requests"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((root / "result.json").read_text())
    print(f"\nsubprocess {wall:.1f} s; in it: {result['seconds']}")
    return {
        "root": root,
        "result": result,
        "proxy_requests": requests,
        "guard": guard_log.read_text().splitlines(),
    }


def test_analysis_run_dir_holds_tables_and_images(published: dict[str, Any]) -> None:
    from mtad.paper.wandb_publish import analysis_run_id

    info = published["result"]["second"]
    run_dir = Path(info["dir"])
    assert info["id"] == analysis_run_id(STUDY, PROFILE) and info["mode"] == "offline"
    records = read_wandb_records(run_dir / f"run-{info['id']}.wandb")
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.run_id, run.run_group, run.job_type) == (info["id"], STUDY, "analysis")

    history: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.update(_items(record))
        elif kind == "summary":
            summary.update(_items(record))
    logged = {k.rsplit("/", 1)[0]: v for k, v in history.items() if k.endswith("/path")}
    expected_tables = ["table/main", "table/energy", "numeric/main", "ratios", "claims"]
    for key in expected_tables:
        path = run_dir / "files" / logged[key]
        assert str(logged[key]).startswith("media/table/") and path.is_file(), key
    main = json.loads((run_dir / "files" / logged["table/main"]).read_text())
    assert main["columns"] == ["method", "humaneval / pass@1", "humaneval / speed-up vs AR"]
    assert ["mtad", "0.15 ± 0.02 (n=2)", "1.42 ± 0.03 (n=2)"] in main["data"]
    energy = json.loads((run_dir / "files" / logged["table/energy"]).read_text())
    assert ["mtad", "not run: no GPU"] in energy["data"]
    numeric = json.loads((run_dir / "files" / logged["numeric/main"]).read_text())
    assert numeric["data"][1][4:] == [7.0, None, 2]  # numbers stay numbers, NaN -> null

    image = run_dir / "files" / logged["figure/ablation_tau"]
    assert str(logged["figure/ablation_tau"]).startswith("media/images/")
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert summary["ratio/tiny/prompts/mtad/speedup_vs_sps"] == pytest.approx(1.27)
    assert summary["ratio/tiny/prompts/mtad/energy_ratio_vs_sps"] == pytest.approx(0.8)
    assert "ratio/tiny/prompts/sps/score_change_vs_ar" not in summary  # NaN is not logged
    assert summary["claims_holding"] == 1
    print(f"analysis run {info['id']}: {len(logged)} media files, {len(summary)} summary keys")


def test_rerendering_keeps_one_analysis_run(published: dict[str, Any]) -> None:
    result = published["result"]
    root = published["root"]
    assert result["first"]["id"] == result["second"]["id"]
    ids = set()
    folders = sorted((root / "wandb").glob("*run-*"))
    for folder in folders:
        for file in folder.glob("run-*.wandb"):
            if file.stat().st_size:
                records = read_wandb_records(file)
                ids |= {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"}
    assert ids == {result["second"]["id"]}
    analysis = [f for f in folders if f.name.endswith(result["second"]["id"])]
    assert [str(f) for f in analysis] == [result["second"]["dir"]]
    # a harness run's folder beside it is left alone
    assert (root / "wandb" / f"offline-run-20260101_000000-{HARNESS_RUN_ID}").is_dir()
    print(f"folders: {[f.name for f in folders]}; distinct analysis ids: {len(ids)}")


def test_report_definition_parses_and_names_the_project(published: dict[str, Any]) -> None:
    import wandb_workspaces.reports.v2 as wr

    from mtad.paper.wandb_publish import analysis_run_id, load_report_definition

    written = published["result"]["written"]
    path = Path(written["definition"])
    assert path == Path(published["root"]) / "out" / "report" / "report.json"
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert data["project"] == "mtad" and data["viewspec"]["project"]["name"] == "mtad"
    assert data["entity"] == ENTITY and {rs["entity"] for rs in data["runsets"]} == {ENTITY}
    assert CLAIM in text and "1.42 ± 0.03 (n=2)" in text
    assert analysis_run_id(STUDY, PROFILE) in text and f"'{STUDY}'" in text
    report = load_report_definition(path)
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    panels = [p for g in grids for p in g.panels]
    assert {type(p).__name__ for p in panels} >= {"BarPlot", "ScatterPlot", "MediaBrowser"}
    assert all((rs.entity, rs.project) == (ENTITY, "mtad") for g in grids for rs in g.runsets)
    assert any(
        "figure/ablation_tau" in p.media_keys for p in panels if isinstance(p, wr.MediaBrowser)
    )
    print(f"report.json: {len(text)} chars, {len(grids)} panel grids, {len(panels)} panels")


def test_report_markdown_holds_the_tables(published: dict[str, Any]) -> None:
    written = published["result"]["written"]
    md = Path(written["markdown"]).read_text()
    for cell in ("0.15 ± 0.02 (n=2)", "1.42 ± 0.03 (n=2)", CLAIM, "1.27", "humaneval / pass@1"):
        assert cell in md, cell
    assert "summary `block_efficiency` against config `method.tau`" in md
    link = "../figures/ablation_tau.png"
    assert f"]({link})" in md and (Path(written["markdown"]).parent / link).is_file()


def test_publish_md_has_the_sync_commands(published: dict[str, Any]) -> None:
    written = published["result"]["written"]
    text = Path(written["publish_md"]).read_text()
    analysis = Path(published["result"]["second"]["dir"]).name
    harness = f"offline-run-20260101_000000-{HARNESS_RUN_ID}"
    sync = next(
        line
        for line in text.splitlines()
        if line.startswith(f"wandb sync --project mtad --entity {ENTITY} ")
    )
    assert f"wandb/{analysis}" in sync and f"wandb/{harness}" in sync
    assert f"wandb sync --yes --project mtad --entity {ENTITY}" in text
    assert (
        f"WANDB_MODE=online python scripts/reproduce.py main --profile {PROFILE} --publish" in text
    )
    assert "http" not in text  # no URL that W&B did not return


def test_no_network_call_is_attempted(published: dict[str, Any]) -> None:
    """Offline logging and report writing attempt no network connection.

    Two watchers, both shown able to fire by the tests below:
    - the proxy listener: every proxy variable points at a local listener that counts
      connections, so an HTTP(S) request from Python (requests, urllib, httpx) or from
      wandb-core -- a Go subprocess that no Python patch reaches, whose net/http honours the
      proxy variables -- arrives there (``test_proxy_listener_sees_wandb_core_online`` shows
      wandb-core's own traffic arriving);
    - the in-process guard records and refuses any name lookup of another host and any TCP
      connect to a non-loopback address from the Python side, including ones that bypass the
      proxy.
    What neither sees: a direct (non-proxied) connection made by wandb-core or another
    non-Python child process, or raw C-level sockets in extension modules. Offline mode is
    what keeps wandb-core off the network; this test checks that nothing we call asks it to.
    """
    assert published["proxy_requests"] == []
    assert published["guard"] == []
    print(f"proxy connections: {len(published['proxy_requests'])}; guard: {published['guard']}")


def test_guard_refuses_and_records_a_non_loopback_connect(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "guard.log"
    install_network_guard(log, monkeypatch.setattr)
    with pytest.raises(OSError, match="network guard"):
        socket.create_connection(("192.0.2.1", 443), timeout=0.5)  # TEST-NET-1
    with pytest.raises(OSError, match="network guard"):
        socket.getaddrinfo("api.example.org", 443)
    sock = socket.socket()
    try:
        with pytest.raises(OSError, match="network guard"):
            sock.connect(("198.51.100.7", 80))
    finally:
        sock.close()
    with connection_counter() as counter:  # loopback stays allowed
        socket.create_connection(("127.0.0.1", counter["port"]), timeout=2).close()
        time.sleep(0.2)
        assert len(counter["requests"]) == 1
    assert len(log.read_text().splitlines()) == 3


def test_proxy_listener_sees_a_proxied_request(monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.request

    with connection_counter() as counter:
        for key, value in _proxy_env(counter["port"]).items():
            if key in PROXY_VARS:
                monkeypatch.setenv(key, value)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        # urlopen builds its global opener once, reading the proxy variables then: build this
        # test's own and drop it afterwards, or later tests' requests go to the dead listener
        monkeypatch.setattr(urllib.request, "_opener", None)
        with pytest.raises(OSError):  # the listener hangs up: the request fails
            urllib.request.urlopen("http://example.invalid/", timeout=5)
        time.sleep(0.2)
    assert len(counter["requests"]) == 1 and b"example.invalid" in counter["requests"][0]


@pytest.mark.slow
def test_proxy_listener_sees_wandb_core_online(tmp_path: Path) -> None:
    """The positive control for wandb-core: an *online* init with a dummy key sends its
    requests through the proxy variables to the listener (so the offline zero means
    something)."""
    code = (
        "import wandb\n"
        "try:\n"
        f"    wandb.init(project='p', dir={str(tmp_path)!r}, settings=wandb.Settings("
        "init_timeout=5, console='off', x_disable_stats=True)).finish()\n"
        "except Exception as err:\n"
        "    print(type(err).__name__)\n"
    )
    with connection_counter() as counter:
        env = _proxy_env(counter["port"])
        env.update(WANDB_MODE="online", WANDB_API_KEY="0" * 40)
        subprocess.run([sys.executable, "-c", code], env=env, timeout=180, capture_output=True)
        requests = list(counter["requests"])
    from_core = [r for r in requests if b"Go-http-client" in r]  # wandb-core's user agent
    assert from_core, f"{len(requests)} proxied connections, none from wandb-core"
    print(f"online: {len(requests)} proxied connections, {len(from_core)} from wandb-core")


@pytest.mark.slow
def test_naive_report_serialisation_would_be_caught(tmp_path: Path) -> None:
    """The failure ``report_definition`` avoids, caught by the same watchers: serialising a
    report whose run sets name an entity (``Report._to_model()`` as ``save()`` does) looks up
    the project on the W&B server, and those requests reach the proxy listener."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_paper_wandb import synthetic_rendered\n"
        "from mtad.paper.wandb_publish import build_report\n"
        f"report = build_report(synthetic_rendered(Path({str(tmp_path)!r})), entity='team')\n"
        "try:\n"
        "    report._to_model()\n"
        "except Exception as err:\n"
        "    print(type(err).__name__)\n"
    )
    with connection_counter() as counter:
        env = _proxy_env(counter["port"])
        env.update(WANDB_API_KEY="0" * 40, PYTHONPATH=str(ROOT))
        subprocess.run([sys.executable, "-c", code], env=env, timeout=180, capture_output=True)
        time.sleep(0.2)
        requests = list(counter["requests"])
    assert requests, "the naive serialisation made no request: the watcher would miss it"
    print(f"naive serialisation: {len(requests)} proxied connections")


def test_publish_needs_online_mode(tmp_path: Path) -> None:
    from mtad.paper.wandb_publish import PublishError, write_report

    rendered = synthetic_rendered(tmp_path)
    with pytest.raises(PublishError, match="WANDB_MODE=online"):
        write_report(rendered, project="mtad", entity=None, publish=True, mode="offline")
    assert (tmp_path / "out" / "report" / "report.json").is_file()  # written before publishing


def test_publish_without_login_says_what_to_do(tmp_path: Path) -> None:
    """Online but not logged in: one PublishError line that names ``wandb login``, and no
    connection attempted (no key, so nothing to send)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_paper_wandb import synthetic_rendered\n"
        "from mtad.paper.wandb_publish import PublishError, publish_report\n"
        "try:\n"
        f"    publish_report(synthetic_rendered(Path({str(tmp_path)!r})), mode='online')\n"
        "except PublishError as err:\n"
        "    print('PublishError:', err)\n"
    )
    home = tmp_path / "home"  # no ~/.netrc, no W&B settings
    home.mkdir()
    with connection_counter() as counter:
        env = _proxy_env(counter["port"])
        env.pop("WANDB_API_KEY", None)
        env.update(HOME=str(home), PYTHONPATH=str(ROOT), WANDB_CONFIG_DIR=str(home / "wandb"))
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, timeout=120, capture_output=True, text=True
        )
        time.sleep(0.2)
        requests = list(counter["requests"])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PublishError:")]
    assert len(lines) == 1 and "wandb login" in lines[0], proc.stdout + proc.stderr[-2000:]
    assert requests == []


if __name__ == "__main__":
    _main(Path(sys.argv[1]), Path(sys.argv[2]))
