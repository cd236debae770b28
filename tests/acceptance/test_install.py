"""The wheel as a new user installs it: one top-level name, a light application side, and an
application whose own ``storage.py``, ``tracer.py``, ``scorers.py`` and ``migrations/`` keep
working beside recalltrace.

One fresh virtual environment for the module (the wheel and its dependencies, without the
``judge`` extra), so that what is checked is what ``pip install recalltrace`` gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.timeout(900)


def _run(cmd: list[str], *, cwd: Path | None = None, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "PYTHON"))}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("install")
    wheels = base / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)])
    (wheel,) = wheels.glob("recalltrace-*.whl")
    env_dir = base / "venv"
    _run([sys.executable, "-m", "venv", str(env_dir)])
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)])
    yield env_dir


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


def test_an_app_with_its_own_storage_tracer_scorers_and_migrations(
    venv: Path, tmp_path: Path
) -> None:
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

            recalltrace.configure(database_url="sqlite:///app.db", sample_rate=1.0)


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


def test_a_judge_without_the_extra_is_one_line_naming_it(venv: Path, tmp_path: Path) -> None:
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
        assert "pip install 'recalltrace[judge]'" in lines[0]


def test_a_script_inside_a_checkout_imports_the_whole_package(venv: Path, tmp_path: Path) -> None:
    """The README's quick start saved in a clone: the clone's ``recalltrace/`` folder comes first
    on ``sys.path`` there, and must find its parts (``tracer/``, ...) beside it."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    (clone / "app.py").write_text(
        "import recalltrace, recalltrace.tracer, recalltrace.storage, recalltrace.scorers\n"
        "import recalltrace.migrations\n"
        "print(recalltrace.tracer.__file__)\n"
    )
    python = venv / "bin" / "python"
    out = _run([str(python), "app.py"], cwd=clone)
    assert out.strip() == str(clone / "tracer" / "__init__.py")
