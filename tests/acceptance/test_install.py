"""The wheel as a new user installs it: one top-level name, a light application side, and an
application whose own ``storage.py``, ``tracer.py``, ``scorers.py`` and ``migrations/`` keep
working beside recalltrace.

The wheel is built as the README says, with ``python -m build`` (an sdist, then the wheel from
it), once for the module; one fresh virtual environment holds it and its dependencies, without
the ``judge`` extra, so that what is checked is what a user installing the wheel gets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT

# The real-system stage (the wheel built and installed into a fresh virtual environment).
pytestmark = [pytest.mark.timeout(900), pytest.mark.realsystem]


def _run(cmd: list[str], *, cwd: Path | None = None, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "PYTHON"))}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``python -m build`` makes from this checkout (through its sdist)."""
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], timeout=900)
    (wheel,) = dist.glob("recalltrace-*-py3-none-any.whl")
    assert list(dist.glob("recalltrace-*.tar.gz")), "python -m build made no sdist"
    return wheel


@pytest.fixture(scope="module")
def venv(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    env_dir = tmp_path_factory.mktemp("install") / "venv"
    _run([sys.executable, "-m", "venv", str(env_dir)])
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(built)])
    yield env_dir


def _wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (setuptools-scm's, from git: docs/release.md)."""
    found = re.fullmatch(r"recalltrace-([^-]+)-py3-none-any\.whl", wheel.name)
    assert found, wheel.name
    return found.group(1)


def test_the_cli_the_wheel_and_the_changelog_agree_on_the_version(built: Path, venv: Path) -> None:
    from packaging.version import Version

    version = _wheel_version(built)
    python = venv / "bin" / "python"
    probe = "from importlib.metadata import version; print(version('recalltrace'))"
    assert _run([str(python), "-c", probe], cwd=venv).strip() == version
    printed = _run([str(venv / "bin" / "recalltrace"), "--version"], cwd=venv).strip()
    assert printed == f"recalltrace {version}"
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## \[([^\]]+)\]", changelog, flags=re.MULTILINE)
    releases = [s for s in sections if s != "Unreleased"]
    parsed = Version(version)
    if parsed.is_devrelease or parsed.local:
        # A build between releases: newer than the last release the changelog names.
        assert sections[0] == "Unreleased", sections
        assert not releases or parsed > Version(releases[0]), (version, releases)
    else:
        # A tagged release: its section is the changelog's first release.
        assert releases and releases[0] == version, releases
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'pip install "$(ls dist/recalltrace-*.whl)[judge]"' in readme


def test_the_wheel_installs_one_top_level_name(venv: Path) -> None:
    python = venv / "bin" / "python"
    script = textwrap.dedent(
        """
        import json
        from importlib.metadata import distribution
        files = distribution("recalltrace").files or []
        tops = sorted({f.parts[0] for f in files if not f.parts[0].endswith(".dist-info")})
        print(json.dumps(tops))
        """
    )
    tops = json.loads(_run([str(python), "-c", script], cwd=venv))
    # Console scripts land outside site-packages ("../../../bin/recalltrace").
    assert [t for t in tops if t != ".."] == ["recalltrace"]
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip()
    )
    for generic in ("tracer", "scorers", "storage", "migrations"):
        assert not (site / generic).exists(), f"{generic} installed at the top of site-packages"


def test_the_application_side_installs_without_the_judge(venv: Path) -> None:
    python = venv / "bin" / "python"
    probe = "import importlib.util as u; print(u.find_spec('litellm') is None)"
    assert _run([str(python), "-c", probe]).strip() == "True"


@pytest.mark.parametrize("storage_process", [False, True])
def test_an_app_with_its_own_storage_tracer_scorers_and_migrations(
    venv: Path, tmp_path: Path, storage_process: bool
) -> None:
    """Installed from the wheel, beside modules named like recalltrace's parts; through a
    storage process too, which starts with the app's sys.path and still imports recalltrace's."""
    app = tmp_path / "app"
    (app / "migrations").mkdir(parents=True)
    (app / "storage.py").write_text("WHO = 'the app storage'\n")
    (app / "tracer.py").write_text("WHO = 'the app tracer'\n")
    (app / "scorers.py").write_text("WHO = 'the app scorers'\n")
    (app / "migrations" / "__init__.py").write_text("WHO = 'the app migrations'\n")
    (app / "migrations" / "env.py").write_text("raise RuntimeError('the app migrations ran')\n")
    (app / "main.py").write_text(
        textwrap.dedent(
            """
            import migrations, scorers, storage, tracer
            import recalltrace

            assert storage.WHO == "the app storage", storage
            assert tracer.WHO == "the app tracer", tracer
            assert scorers.WHO == "the app scorers", scorers
            assert migrations.WHO == "the app migrations", migrations

            recalltrace.configure(
                database_url="sqlite:///app.db", sample_rate=1.0, storage_process=STORAGE_PROCESS
            )


            @recalltrace.retrieval
            def search(query):
                return [{"id": "kb-1", "content": "Reset your password from the sign-in page."}]


            @recalltrace.rag
            def answer(question):
                search(question)
                recalltrace.set_reference(
                    recalltrace.current_trace_id(), reference_context_ids=["kb-1"]
                )
                return "Use the sign-in page."


            for _ in range(3):
                answer("How do I reset my password?")
            assert recalltrace.flush(30), "flush timed out"
            recalltrace.shutdown(30)
            print("traced")
            """
        )
    )
    main = (app / "main.py").read_text().replace("STORAGE_PROCESS", str(storage_process))
    (app / "main.py").write_text(main)
    python = venv / "bin" / "python"
    assert _run([str(python), "main.py"], cwd=app).strip().endswith("traced")
    recalltrace_cli = str(venv / "bin" / "recalltrace")
    url = f"sqlite:///{app / 'app.db'}"
    _run([recalltrace_cli, "worker", "--once", "--database-url", url, "--no-progress"], cwd=app)
    out = _run(
        [recalltrace_cli, "scores", "summary", "--database-url", url, "--format", "json"], cwd=app
    )
    rows = {row["metric"]: row for row in json.loads(out)}
    assert rows["id_based_context_recall"]["count"] == 3
    assert rows["id_based_context_recall"]["mean"] == 1.0


def test_a_judge_without_the_extra_is_one_line_naming_it(
    built: Path, venv: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'judge.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    subprocess.run(
        [str(venv / "bin" / "recalltrace"), "db", "upgrade", "--database-url", url],
        cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    for command in (
        ["worker", "--once", "--database-url", url, "--judge-model", "openai/gpt-4o-mini"],
        ["demo", "--database-url", url, "--judge-model", "openai/gpt-4o-mini"],
    ):
        result = subprocess.run(
            [str(venv / "bin" / "recalltrace"), *command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        # What works: no "recalltrace" distribution can be installed from an index.
        assert "pip install 'recalltrace[judge]'" not in lines[0]
        assert "pip install '.[judge]'" in lines[0], lines[0]
        wheel = f"dist/recalltrace-{_wheel_version(built)}-py3-none-any.whl[judge]"
        assert wheel in lines[0], lines[0]


def test_the_readme_first_command_and_quick_start_in_a_fresh_clone(
    venv: Path, tmp_path: Path
) -> None:
    """A newcomer's first minutes: clone, the README's first command as written (a virtual
    environment, ``pip install .`` in it, ``recalltrace demo``), then the quick start saved as
    ``app.py`` and run with that environment's Python inside the clone (where the clone's
    ``recalltrace/`` folder comes first on ``sys.path`` and must find its parts beside it) and
    from another folder."""
    import re

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    readme = (clone / "README.md").read_text(encoding="utf-8")
    first = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)[0].splitlines()[0]
    command = first.split("#", 1)[0].strip()
    assert command == (
        "python3 -m venv .venv && . .venv/bin/activate && pip install . && recalltrace demo"
    ), command
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "PYTHON"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["sh", "-c", command.replace("pip install .", "pip install -q .")],
        cwd=clone, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    quick_start = re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for folder in (clone, elsewhere):
        (folder / "app.py").write_text(quick_start, encoding="utf-8")
        ran = subprocess.run(
            [str(clone / ".venv" / "bin" / "python"), "app.py"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert ran.returncode == 0, (folder, ran.stderr[-3000:])
        assert ran.stdout.startswith("Refunds are available within 30 days"), ran.stdout
        assert (folder / "recalltrace.db").exists()


def test_the_compose_stack_scores_a_trace_from_its_own_files(venv: Path, tmp_path: Path) -> None:
    """``deploy/compose.yml`` as it runs, without a container engine (none runs here): the
    worker service's image is the wheel built from the repository (as ``deploy/Dockerfile``
    builds it: the ``venv`` fixture), its environment and its command are read from the compose
    file and run as written, against a scratch database of the test Postgres instead of the
    ``postgres`` service, and a real Prometheus reads the stack's ``prometheus.yml`` (its
    ``worker`` target pointed at the worker's port) with the shipped rules: a stored trace is
    scored, and Prometheus scrapes the worker and evaluates the rules."""
    import shutil
    import socket
    import time
    import urllib.parse
    import urllib.request

    import yaml
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from recalltrace.storage.db import create_engine_from_url
    from tests.support.factories import make_repository, make_trace
    from tests.support.postgres import admin_engine, base_url, require_postgres

    require_postgres()
    deploy = ROOT / "deploy"
    dockerfile = (deploy / "Dockerfile").read_text(encoding="utf-8")
    assert "pip wheel" in dockerfile and "recalltrace-*.whl)[judge]" in dockerfile
    compose = yaml.safe_load((deploy / "compose.yml").read_text(encoding="utf-8"))
    worker = compose["services"]["worker"]
    assert worker["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert (deploy / worker["build"]["context"] / worker["build"]["dockerfile"]).is_file()
    assert worker["entrypoint"] == ["sh", "-c"]
    (script,) = worker["command"]

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    database = f"rt_compose_{os.getpid()}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{database}"'))
    url = make_url(base_url()).set(database=database).render_as_string(hide_password=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "OTEL_"))}
    env.update({k: str(v) for k, v in (worker.get("environment") or {}).items()})
    # The compose project's names, resolved as the engine would here.
    env["RECALLTRACE_DATABASE_URL"] = url
    env["RECALLTRACE_JUDGE_MODEL"] = ""
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    command = script.replace("--prometheus-port 9464", f"--prometheus-port {port}")
    service = subprocess.Popen(
        ["sh", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    prometheus_config = yaml.safe_load((deploy / "prometheus" / "prometheus.yml").read_text())
    rules = deploy / "prometheus" / "recalltrace-rules.yml"
    shutil.copy(rules, tmp_path / rules.name)
    prometheus_config["rule_files"] = [str(tmp_path / rules.name)]
    prometheus_config["global"]["scrape_interval"] = "1s"
    prometheus_config["global"]["evaluation_interval"] = "1s"
    (scrape,) = prometheus_config["scrape_configs"]
    assert scrape["static_configs"][0]["targets"] == ["worker:9464"]
    scrape["static_configs"][0]["targets"] = [f"127.0.0.1:{port}"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        web = probe.getsockname()[1]
    prometheus_bin = shutil.which("prometheus")
    assert prometheus_bin, "prometheus is not installed (apt-get install prometheus)"
    prometheus = subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def query(expr: str) -> list[dict[str, object]]:
        address = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(address, timeout=5) as reply:
                return list(json.loads(reply.read())["data"]["result"])
        except OSError:
            return []

    engine = create_engine_from_url(url)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not query('up{job="recalltrace_worker"} == 1'):
            assert service.poll() is None, "the worker service exited"
            time.sleep(0.5)
        assert query('up{job="recalltrace_worker"} == 1'), "Prometheus never scraped the worker"
        repo = make_repository(engine, metrics=["id_based_context_recall"])
        repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(3)])
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                scored = conn.execute(text("SELECT count(*) FROM scores")).scalar_one()
            if scored >= 3 and query("rag_context_recall_count"):
                break
            time.sleep(0.5)
        assert scored >= 3, scored
        assert query("rag_context_recall_count"), "the scores never reached Prometheus"
        # The shipped recording rules evaluate on the stack's own configuration.
        while time.monotonic() < deadline and not query("rag:context_recall:mean5m"):
            time.sleep(0.5)
        assert query("rag:context_recall:mean5m"), "the shipped rules never evaluated"
    finally:
        service.terminate()
        prometheus.terminate()
        service.wait(timeout=60)
        prometheus.wait(timeout=60)
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()
