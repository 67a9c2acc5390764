"""`dp2ddp check` end to end: output formats, exit codes, selection, noqa, config,
--fix/--diff, --new-only/--since, parallel runs, and that torch is never imported."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dp2ddp.cli import main

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent

DP_SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn

    model = nn.DataParallel(Net()).cuda()
    for x in torch.utils.data.DataLoader(data, batch_size=8, shuffle=True):
        model(x).sum().backward()
    """
)

DDP_SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    dist.init_process_group("gloo")
    loader = DataLoader(ds, shuffle=True, sampler=DistributedSampler(ds))
    torch.save(model.state_dict(), "m.pt")
    """
)


def run(args, cwd=None, stdin=None, env=None):
    """Run the real CLI in a subprocess: (rc, stdout, stderr)."""
    proc = subprocess.run(
        [PY, "-m", "dp2ddp", "check", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def proj(tmp_path):
    (tmp_path / "dp.py").write_text(DP_SCRIPT)
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    (tmp_path / "clean.py").write_text("import os\nprint(os.getcwd())\n")
    return tmp_path


def test_text_output_and_exit_codes(proj, capsys):
    rc = main(["check", str(proj / "dp.py")])
    out = capsys.readouterr().out
    assert rc == 1
    # DDP001's fix is the migration, which may refuse the file: no [*] promise per finding
    assert f"{proj / 'dp.py'}:4:9: DDP001 `DataParallel` is used" in out
    assert "Found 1 error." in out and "fixable with the `--fix` option" not in out
    assert "1 file with DataParallel: `--fix` migrates each to DDP or says why it cannot" in out
    assert "\x1b[" not in out  # no colour when stdout is not a terminal
    assert main(["check", str(proj / "clean.py")]) == 0
    assert "All checks passed!" in capsys.readouterr().out


def test_directory_recursion_and_sorting(proj, capsys):
    (proj / "sub").mkdir()
    (proj / "sub" / "more.py").write_text(DP_SCRIPT)
    rc = main(["check", str(proj)])
    out = capsys.readouterr().out
    assert rc == 1
    lines = [l for l in out.splitlines() if ": DDP" in l]
    files = [l.split(":")[0] for l in lines]
    assert files == sorted(files)
    assert {Path(f).name for f in files} == {"dp.py", "ddp.py", "more.py"}
    codes = {l.split()[1] for l in lines}
    assert {"DDP001", "DDP003", "DDP004", "DDP008"} <= codes


def test_select_ignore_prefix_all(proj, capsys):
    assert main(["check", "--select", "DDP003", str(proj)]) == 1
    out = capsys.readouterr().out
    assert "DDP003" in out and "DDP001" not in out and "DDP004" not in out
    assert main(["check", "--select", "ALL", "--ignore", "DDP0", str(proj)]) == 0
    capsys.readouterr()
    assert main(["check", "--ignore", "DDP001,DDP003", "--ignore", "DDP004", "--ignore", "DDP008", str(proj)]) == 0


def test_unknown_code_is_a_usage_error(proj):
    rc, out, err = run(["--select", "DDP999", str(proj)])
    assert rc == 2
    assert "unknown rule code 'DDP999'" in err and "DDP001" in err and "DDP015" in err
    assert "Traceback" not in err


def test_noqa(tmp_path, capsys):
    src = DP_SCRIPT.replace("nn.DataParallel(Net()).cuda()", "nn.DataParallel(Net()).cuda()  # noqa: DDP001")
    (tmp_path / "a.py").write_text(src)
    (tmp_path / "b.py").write_text(DP_SCRIPT.replace(".cuda()", ".cuda()  # noqa"))
    (tmp_path / "c.py").write_text(DP_SCRIPT.replace(".cuda()", ".cuda()  # noqa: DDP004"))
    rc = main(["check", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "a.py" not in out and "b.py" not in out and "c.py:4:9: DDP001" in out


def test_syntax_error_is_reported_and_does_not_stop_the_run(proj):
    (proj / "broken.py").write_text("import torch.nn as nn\nnn.DataParallel(\n")
    rc, out, err = run([str(proj)])
    assert rc == 2
    assert f"{proj / 'broken.py'}:" in out and "syntax error" in out
    assert "dp.py:4:9: DDP001" in out  # the other files are still checked
    assert "Traceback" not in out + err


def test_missing_path(proj):
    rc, out, err = run([str(proj / "nope.py"), str(proj / "dp.py")])
    assert rc == 2
    assert "nope.py: no such file or directory" in out and "DDP001" in out


def test_json_output(proj, capsys):
    assert main(["check", "--format", "json", str(proj)]) == 1
    items = json.loads(capsys.readouterr().out)
    dp = [i for i in items if i["code"] == "DDP001"][0]
    assert dp["name"] == "data-parallel-usage"
    assert dp["location"] == {"row": 4, "column": 9} and dp["end_location"]["row"] == 4
    assert dp["fix"] is not None
    assert Path(dp["filename"]).name == "dp.py"


def test_sarif_output(proj, capsys):
    assert main(["check", "--format", "sarif", str(proj)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == "2.1.0" and "sarif-2.1.0" in doc["$schema"]
    run_ = doc["runs"][0]
    rules = run_["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} >= {"DDP001", "DDP015"}
    res = run_["results"]
    assert res and all(rules[r["ruleIndex"]]["id"] == r["ruleId"] for r in res)
    region = res[0]["locations"][0]["physicalLocation"]["region"]
    assert region["startLine"] >= 1 and region["startColumn"] >= 1


def test_github_output(proj, capsys):
    assert main(["check", "--format", "github", str(proj / "dp.py")]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("::warning file=") and ",line=4,col=9," in out[0]
    assert "title=dp2ddp (DDP001)::" in out[0]


def test_statistics_and_exit_zero(proj, capsys):
    assert main(["check", "--statistics", str(proj)]) == 1
    out = capsys.readouterr().out
    assert any(l.split("\t")[1:2] == ["DDP001"] and l.strip().startswith("1") for l in out.splitlines())
    assert main(["check", "--exit-zero", str(proj)]) == 0


def test_fix_dataloader_shuffle_and_diff(tmp_path, capsys):
    f = tmp_path / "loader.py"
    src = (
        "from torch.utils.data import DataLoader, DistributedSampler\n\n"
        "loader = DataLoader(ds, shuffle=True, sampler=DistributedSampler(ds))\n"
    )
    f.write_text(src)
    # --diff shows and does not write
    assert main(["check", "--select", "DDP003", "--diff", str(f)]) == 1
    out = capsys.readouterr().out
    assert "-loader = DataLoader(ds, shuffle=True, sampler=DistributedSampler(ds))" in out
    assert "+loader = DataLoader(ds, sampler=DistributedSampler(ds))" in out
    assert f.read_text() == src
    # --fix writes; everything fixed, nothing left: exit 0 (ruff's rule, and rewrite's)
    assert main(["check", "--select", "DDP003", "--fix", str(f)]) == 0
    assert "1 fixed, 0 remaining" in capsys.readouterr().out
    assert f.read_text() == src.replace("shuffle=True, ", "")
    assert main(["check", "--select", "DDP003", str(f)]) == 0
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temp file


def test_fix_data_parallel_runs_the_migration(tmp_path, capsys):
    """DDP001's fix is the whole DP->DDP migration (dp2ddp.migrate)."""
    f = tmp_path / "train.py"
    f.write_text(DP_SCRIPT)
    rc = main(["check", "--select", "DDP001", "--fix", str(f)])
    assert rc in (0, 1)  # 1 when the migration leaves warnings, as `rewrite` exits
    new = f.read_text()
    assert "DataParallel(" not in new.replace("DistributedDataParallel(", "")
    assert "nn.DataParallel" not in new
    compile(new, str(f), "exec")
    assert main(["check", "--select", "DDP001", str(f)]) == 0


def test_stdin(proj):
    rc, out, err = run(["-"], stdin=DP_SCRIPT)
    assert rc == 1 and "<stdin>:4:9: DDP001" in out
    rc, out, err = run(["--select", "DDP003", "--fix", "-"], stdin=DDP_SCRIPT)
    assert rc == 0
    assert "shuffle=True" not in out and "DataLoader(ds, sampler=DistributedSampler(ds))" in out
    assert "1 fixed" in err


def test_pyproject_config(proj, capsys):
    (proj / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.dp2ddp]\nignore = ["DDP004"]\nextend-select = ["DDP014"]\nexclude = ["sub"]\n'
    )
    (proj / "sub").mkdir()
    (proj / "sub" / "legacy.py").write_text(DP_SCRIPT)
    rc = main(["check", str(proj)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "DDP004" not in out and "DDP014" in out and "legacy.py" not in out
    # an excluded file passed explicitly (as pre-commit does) is skipped too
    assert main(["check", str(proj / "sub" / "legacy.py")]) == 0
    capsys.readouterr()
    assert main(["check", "--no-config", str(proj / "sub" / "legacy.py")]) == 1


@pytest.mark.parametrize(
    "body,needle",
    [
        ('[tool.dp2ddp]\nselect = ["NOPE1"]\n', "unknown rule code 'NOPE1'"),
        ("[tool.dp2ddp]\nbogus = 1\n", "unknown option 'bogus'"),
        ("[tool.dp2ddp]\nselect = 3\n", "must be a list of strings"),
        ("[tool.dp2ddp\n", "invalid TOML"),
    ],
)
def test_bad_config_is_exit_2(proj, body, needle):
    (proj / "pyproject.toml").write_text(body)
    rc, out, err = run([str(proj)])
    assert rc == 2
    assert "pyproject.toml" in err and needle in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- git


def git(cwd, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "legacy.py").write_text(DP_SCRIPT)
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "legacy")
    return tmp_path


def test_new_only_flags_only_added_lines(repo):
    legacy = repo / "legacy.py"
    legacy.write_text(DP_SCRIPT + "print('touched')\n")
    rc, out, err = run(["--new-only", "legacy.py"], cwd=repo)
    assert rc == 0, out + err
    assert "1 more finding on unchanged lines not shown" in out
    legacy.write_text(DP_SCRIPT + "other = nn.DataParallel(Other())\n")
    rc, out, err = run(["--new-only", "legacy.py"], cwd=repo)
    assert rc == 1
    assert "legacy.py:7:9: DDP001" in out and "legacy.py:4:" not in out
    # an untracked file is all new
    (repo / "fresh.py").write_text(DP_SCRIPT)
    rc, out, err = run(["--new-only", "fresh.py"], cwd=repo)
    assert rc == 1 and "fresh.py:4:9: DDP001" in out
    # --no-new-only (what a hook's args can add) flags every occurrence
    rc, out, err = run(["--new-only", "--no-new-only", "legacy.py"], cwd=repo)
    assert rc == 1 and "legacy.py:4:9: DDP001" in out


def test_since_rev(repo):
    git(repo, "tag", "base")
    (repo / "legacy.py").write_text(DP_SCRIPT + "other = nn.DataParallel(Other())\n")
    git(repo, "commit", "-q", "-am", "more dp")
    rc, out, err = run(["--since", "base", "."], cwd=repo)
    assert rc == 1 and "legacy.py:7:9: DDP001" in out and "legacy.py:4:" not in out
    rc, out, err = run(["--since", "HEAD", "."], cwd=repo)
    assert rc == 0
    rc, out, err = run(["--since", "no-such-rev", "."], cwd=repo)
    assert rc == 2 and "unknown revision 'no-such-rev'" in err


def test_new_only_outside_git_is_an_input_error(tmp_path):
    (tmp_path / "a.py").write_text(DP_SCRIPT)
    rc, out, err = run(["--new-only", str(tmp_path / "a.py")], cwd=tmp_path, env={"GIT_CEILING_DIRECTORIES": str(tmp_path.parent)})
    assert rc == 2 and "not inside a git repository" in err


# --------------------------------------------------------------------------- parallel, imports


def test_parallel_equals_serial(tmp_path):
    srcs = [DP_SCRIPT, DDP_SCRIPT, "import os\n", "x = 1\n"]
    for i in range(40):
        (tmp_path / f"f{i:02d}.py").write_text(srcs[i % len(srcs)])
    rc1, serial, _ = run(["-j", "1", "--format", "json", str(tmp_path)])
    rc2, parallel, _ = run(["-j", "2", "--format", "json", str(tmp_path)])
    assert rc1 == rc2 == 1
    assert json.loads(serial) == json.loads(parallel)
    assert len(json.loads(serial)) >= 40


def test_check_never_imports_torch(proj):
    code = (
        "import sys\n"
        "from dp2ddp.cli import main\n"
        f"rc = main(['check', '--select', 'ALL', {str(proj)!r}])\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print('TORCH', bad)\n"
        "sys.exit(0 if not bad else 3)\n"
    )
    proc = subprocess.run([PY, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "TORCH []" in proc.stdout
    imported = [l.split("|")[-1].strip() for l in proc.stderr.splitlines() if l.startswith("import time:")]
    assert "torch" not in imported


def test_gates_skip_parsing(tmp_path, monkeypatch):
    """A file that no selected rule's gate lets through is never parsed."""
    from dp2ddp.check import analyze
    from dp2ddp.check.engine import check_bytes
    from dp2ddp.registry import select

    calls = []
    real = analyze.parse_model
    monkeypatch.setattr(analyze, "parse_model", lambda data, path: calls.append(path) or real(data, path))
    codes = select()
    # mentions only DistributedDataParallel and torch.save's module, no rule can fire
    check_bytes(b"import torch\nx = torch.zeros(3)\n", "plain.py", codes)
    assert calls == []
    check_bytes(DP_SCRIPT.encode(), "dp.py", codes)
    assert calls == ["dp.py"]


def test_check_never_imports_libcst_without_fix(proj):
    code = (
        "import sys\n"
        "from dp2ddp.cli import main\n"
        f"rc = main(['check', '--no-cache', '--select', 'ALL', {str(proj)!r}])\n"
        "print('LIBCST', 'libcst' in sys.modules)\n"
    )
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300)
    assert "LIBCST False" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_color_on_tty_only(proj):
    import pty

    code = f"from dp2ddp.cli import main; main(['check', {str(proj / 'dp.py')!r}])"
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - child
        os.execv(PY, [PY, "-c", code])
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    assert b"\x1b[" in b"".join(chunks)


# --------------------------------------------------------------------------- result cache


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory, monkeypatch):
    """Every test gets its own cache folder (never the checkout's .dp2ddp_cache)."""
    monkeypatch.setenv("DP2DDP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.delenv("DP2DDP_NO_CACHE", raising=False)


def _cache_files(cache: Path):
    return sorted(p for p in cache.rglob("check-*.json"))


def _many(tmp_path, n=20):
    srcs = [DP_SCRIPT, DDP_SCRIPT, "import os\n", "x = 1\n", "import torch.nn as nn\nnn.DataParallel(\n"]
    for i in range(n):
        (tmp_path / f"f{i:02d}.py").write_text(srcs[i % len(srcs)])


@pytest.mark.parametrize("fmt", ["text", "json", "sarif", "github"])
def test_cached_and_uncached_output_is_identical(tmp_path, fmt):
    src = tmp_path / "src"
    src.mkdir()
    _many(src)
    cache = tmp_path / "cache"
    args = ["--format", fmt, str(src)]
    rc0, uncached, _ = run(["--no-cache", *args])
    assert not cache.exists()
    rc1, cold, _ = run(["--cache-dir", str(cache), *args])
    assert _cache_files(cache), "the cold run fills the cache"
    before = {p: p.read_bytes() for p in _cache_files(cache)}
    rc2, warm, _ = run(["--cache-dir", str(cache), *args])
    assert rc0 == rc1 == rc2 == 2  # the syntax errors are reported, from the cache or not
    assert uncached == cold == warm
    assert {p: p.read_bytes() for p in _cache_files(cache)} == before  # nothing new to write


def test_cache_is_used_and_keyed_by_content_and_rules(tmp_path, monkeypatch):
    """A warm run does not analyse cached files; a changed file or a different rule
    selection is a miss."""
    from dp2ddp.check import engine
    from dp2ddp.check.cache import ResultCache
    from dp2ddp.check.pool import run_jobs
    from dp2ddp.check.results import Job
    from dp2ddp.registry import select

    (tmp_path / "dp.py").write_text(DP_SCRIPT)
    codes = tuple(select())
    jobs = lambda: [Job(str(tmp_path / "dp.py"), codes)]  # noqa: E731
    cache_dir = tmp_path / "c"
    first = run_jobs(jobs(), processes=1, cache=ResultCache(str(cache_dir), codes))
    assert not first[0].cached and first[0].diagnostics
    calls = []
    real = engine.check_bytes
    monkeypatch.setattr(engine, "check_bytes", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    second = run_jobs(jobs(), processes=1, cache=ResultCache(str(cache_dir), codes))
    assert calls == [] and second[0].cached and second[0].diagnostics == first[0].diagnostics
    # another selection: another key
    run_jobs([Job(str(tmp_path / "dp.py"), ("DDP001",))], processes=1, cache=ResultCache(str(cache_dir), ("DDP001",)))
    assert calls == [str(tmp_path / "dp.py")]
    # changed content: a miss
    (tmp_path / "dp.py").write_text(DP_SCRIPT + "# changed\n")
    run_jobs(jobs(), processes=1, cache=ResultCache(str(cache_dir), codes))
    assert len(calls) == 2


def test_cache_dir_default_gitignore_and_options(tmp_path, monkeypatch):
    (tmp_path / "dp.py").write_text(DP_SCRIPT)
    monkeypatch.delenv("DP2DDP_CACHE_DIR")
    rc, out, _ = run([str(tmp_path / "dp.py")], cwd=tmp_path, env={"DP2DDP_CACHE_DIR": ""})
    assert rc == 1
    default = tmp_path / ".dp2ddp_cache"
    assert (default / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (default / "CACHEDIR.TAG").exists() and _cache_files(default)
    # git ignores the whole folder
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert "dp.py" in status and ".dp2ddp_cache" not in status
    # --no-cache and DP2DDP_NO_CACHE write nothing; DP2DDP_CACHE_DIR moves it
    other = tmp_path / "other"
    assert run(["--no-cache", str(tmp_path / "dp.py")], env={"DP2DDP_CACHE_DIR": str(other)})[0] == 1
    assert run([str(tmp_path / "dp.py")], env={"DP2DDP_CACHE_DIR": str(other), "DP2DDP_NO_CACHE": "1"})[0] == 1
    assert not other.exists()
    assert run([str(tmp_path / "dp.py")], env={"DP2DDP_CACHE_DIR": str(other)})[0] == 1
    assert _cache_files(other)


@pytest.mark.parametrize("garbage", [b"", b"{not json", b'{"key": 1}', b"[]", None])
def test_corrupted_cache_is_ignored(tmp_path, garbage):
    src = tmp_path / "src"
    src.mkdir()
    _many(src)
    cache = tmp_path / "cache"
    rc0, expected, _ = run(["--no-cache", "--format", "json", str(src)])
    run(["--cache-dir", str(cache), str(src)])
    for f in _cache_files(cache):
        if garbage is None:  # well-formed JSON, wrong entries
            doc = json.loads(f.read_text())
            for k in doc["files"]:
                doc["files"][k] = [doc["files"][k][0], [["x"] * 9]] if doc["files"][k][1] else "junk"
            f.write_text(json.dumps(doc))
        else:
            f.write_bytes(garbage)
    rc, got, err = run(["--cache-dir", str(cache), "--format", "json", str(src)])
    assert (rc, got) == (rc0, expected) and "Traceback" not in err
    rc, got, err = run(["--cache-dir", str(cache), "--format", "json", str(src)])  # repaired
    assert (rc, got) == (rc0, expected)


def test_fix_and_diff_work_from_a_warm_cache(tmp_path):
    src = tmp_path / "train.py"
    src.write_text("from torch.utils.data import DataLoader, DistributedSampler\n\nloader = DataLoader(ds, shuffle=True, sampler=DistributedSampler(ds))\n")
    assert run(["--select", "DDP003", str(src)])[0] == 1  # fills the cache
    rc, diff, _ = run(["--select", "DDP003", "--diff", str(src)])
    assert rc == 1 and "-loader = DataLoader(ds, shuffle=True, sampler" in diff
    rc, out, _ = run(["--select", "DDP003", "--fix", str(src)])
    assert rc == 0 and "shuffle=True" not in src.read_text()
    rc, out, _ = run(["--select", "DDP003", str(src)])
    assert rc == 0 and "All checks passed!" in out


def test_cache_survives_the_process_pool_and_new_only(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _many(src, 40)
    cache = tmp_path / "cache"
    r1 = run(["-j", "2", "--cache-dir", str(cache), "--format", "json", str(src)])
    r2 = run(["-j", "2", "--cache-dir", str(cache), "--format", "json", str(src)])
    r3 = run(["-j", "1", "--no-cache", "--format", "json", str(src)])
    assert r1[:2] == r2[:2] == r3[:2]
    assert len(_cache_files(cache)) == 1
    # one entry per distinct content; the file that does not parse is never cached
    assert len(json.loads(_cache_files(cache)[0].read_text())["files"]) == 4


def test_new_only_from_a_warm_cache(repo):
    legacy = repo / "legacy.py"
    legacy.write_text(DP_SCRIPT + "other = nn.DataParallel(Other())\n")
    expected = run(["--no-cache", "--new-only", "legacy.py"], cwd=repo)
    assert expected[0] == 1
    run(["legacy.py"], cwd=repo)  # all lines, fills the cache
    assert run(["--new-only", "legacy.py"], cwd=repo) == expected


# --------------------------------------------------------------------------- the migration's codes (DDP1xx)

BLOCKED = "import torch.nn as nn\n\nmodel = nn.DataParallel(model, dim=1)\n"  # DataParallel(dim=1): DDP101
DEVICE_LEFT = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader


    def main():
        model = nn.DataParallel(nn.Linear(8, 1))
        loader = DataLoader(ds, batch_size=4, shuffle=True)
        aux = torch.zeros(1).to("cuda:1")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()


    if __name__ == "__main__":
        main()
    """
)


def test_migration_codes_are_selectable(proj, capsys):
    """DDP1xx codes are codes like any other: select, ignore, extend-select take them."""
    assert main(["check", "--select", "DDP105", str(proj / "dp.py")]) == 0
    assert main(["check", "--ignore", "DDP1", "--extend-select", "DDP130", str(proj / "dp.py")]) == 1
    capsys.readouterr()
    assert main(["check", "--show-rules"]) == 0
    out = capsys.readouterr().out
    assert "DDP105  loader-not-sharded  (default, migration error)" in out and "DDP130" in out


def test_fix_exits_as_rewrite_does(tmp_path, capsys):
    """A clean migration: `rewrite` and `check --fix` exit 0 and write the same file."""
    f = tmp_path / "train.py"
    src = DP_SCRIPT.replace("for x in torch", "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in torch")
    f.write_text(src)
    rc = main(["rewrite", str(f), "-o", str(tmp_path / "rewritten.py")])
    out = capsys.readouterr()
    assert main(["check", "--select", "DDP001", "--fix", str(f)]) == rc, out
    assert f.read_bytes() == (tmp_path / "rewritten.py").read_bytes()


def test_fix_refused_by_the_migration_exits_as_rewrite_does(tmp_path, capsys):
    """A file the migration refuses: `rewrite` exits 1 and leaves it; `check --fix` exits 1,
    leaves it, and reports why (DDP101) with DDP001 no longer offered as fixable."""
    from dp2ddp.cli.rewrite import rewrite  # noqa: F401  (imported for its exit code)

    f = tmp_path / "train.py"
    f.write_text(BLOCKED)
    assert main(["rewrite", str(f), "-o", str(tmp_path / "out.py")]) == 1
    capsys.readouterr()
    assert main(["check", "--fix", str(f)]) == 1
    out = capsys.readouterr().out
    assert f.read_text() == BLOCKED
    assert "train.py:3:9: DDP001 `DataParallel` is used" in out  # no [*]: not fixable after all
    assert re.search(r"train\.py:3:\d+: DDP101 ", out), out
    # before --fix, `check` promised no fix either: the summary said the migration may refuse
    assert main(["check", str(f)]) == 1
    out = capsys.readouterr().out
    assert "[*]" not in out and "migrates each to DDP or says why it cannot" in out
    # --ignore the error: the file is still refused, DDP001 still reported
    assert main(["check", "--fix", "--ignore", "DDP101", str(f)]) == 1
    out = capsys.readouterr().out
    assert "DDP101" not in out and "DDP001" in out
    # --diff: nothing to show, exit 1 as `rewrite --diff` does
    assert main(["check", "--diff", str(f)]) == 1
    assert "DDP101" in capsys.readouterr().err


def test_fix_reports_what_the_migration_leaves(tmp_path, capsys):
    """The migration's warnings are findings of `check --fix` (on the fixed file's lines);
    ``--ignore`` and ``# noqa`` silence them like any code; the file is what `rewrite`
    writes."""
    f = tmp_path / "train.py"
    f.write_text(DEVICE_LEFT)
    rc = main(["rewrite", str(f), "-o", str(tmp_path / "rewritten.py")])
    capsys.readouterr()
    assert main(["check", "--select", "DDP001", "--extend-select", "DDP1", "--fix", str(f)]) == rc == 1
    out = capsys.readouterr().out
    assert f.read_bytes() == (tmp_path / "rewritten.py").read_bytes()
    fixed = f.read_text().splitlines()
    device_line = next(i for i, l in enumerate(fixed, 1) if "cuda:1" in l)
    assert f"train.py:{device_line}:" in out and "DDP109" in out
    assert "DDP100" in out  # a note, shown because it was selected
    for args in (["--ignore", "DDP109"], []):
        f.write_text(DEVICE_LEFT if args else DEVICE_LEFT.replace('.to("cuda:1")', '.to("cuda:1")  # noqa: DDP109'))
        assert main(["check", "--select", "DDP001", "--fix", *args, str(f)]) == 0  # nothing left
        assert "DDP109" not in capsys.readouterr().out


def test_check_fix_on_migrated_files_leaves_no_loss_mean(tmp_path):
    """DDP010 never fires on what the migration produces (the migration removes the idiom
    the rule reports), checked on every rewrite fixture output."""
    from dp2ddp.check.engine import check_bytes

    outs = sorted(p for p in (ROOT / "fixtures").glob("*/*.out.py") if "lint" not in p.parts)
    assert outs
    for p in outs:
        diags = check_bytes(p.read_bytes(), str(p), ("DDP010",)).diagnostics
        assert not diags, f"{p}: {[(d.line, d.message) for d in diags]}"


def test_exclude_patterns_follow_ruff(tmp_path, capsys):
    from dp2ddp.source import excluded

    root = str(tmp_path)
    assert excluded(str(tmp_path / "src" / "third_party" / "x.py"), ["third_party"], root)
    assert excluded(str(tmp_path / "legacy" / "a" / "x.py"), ["legacy/*"], root)
    assert not excluded(str(tmp_path / "src" / "legacy" / "x.py"), ["legacy/*"], root)
    assert excluded(str(tmp_path / "gen_pb2.py"), ["*_pb2.py"], root)
    assert not excluded("-", ["*"], root)


def test_fix_places_migration_findings_after_a_form_feed(tmp_path, capsys):
    """Python counts a form feed as part of its line; ``str.splitlines`` would split there
    and move every later migration finding (and the ``# noqa`` read for it) a line down."""
    src = DEVICE_LEFT.replace("def main():", "# section\x0cone\ndef main():")
    f = tmp_path / "train.py"
    f.write_text(src)
    assert main(["check", "--select", "DDP001", "--extend-select", "DDP109", "--fix", str(f)]) == 1
    out = capsys.readouterr().out
    fixed = re.split(r"\r\n?|\n", f.read_text())
    device_line = next(i for i, l in enumerate(fixed, 1) if "cuda:1" in l)
    assert f"train.py:{device_line}:" in out and "DDP109" in out, out


def test_a_refused_migration_does_not_change_what_the_cache_keeps(tmp_path):
    """``--fix`` of a file whose migration is refused while another fix applies reports
    DDP001 as not fixable, but the cache keeps the plain findings of the new content: a
    later plain check shows what an uncached one shows."""
    from dp2ddp.check.engine import check_bytes

    src = (
        "import torch.nn as nn\nfrom torch.utils.data import DataLoader, DistributedSampler\n\n"
        "model = nn.DataParallel(model, dim=1)\n"
        "loader = DataLoader(ds, batch_size=64, shuffle=True, sampler=DistributedSampler(ds))\n"
    )
    fixed = check_bytes(src.encode(), "train.py", ["DDP001", "DDP003"], fix=True)
    assert fixed.output is not None and fixed.blocked
    assert [d.fixable for d in fixed.diagnostics if d.code == "DDP001"] == [False]
    plain = check_bytes(fixed.output, "train.py", ["DDP001", "DDP003"])
    stored = {(d.code, d.line): d.fixable for d in fixed.store[1]}
    assert stored == {(d.code, d.line): d.fixable for d in plain.diagnostics}


@pytest.mark.parametrize("fix", [False, True], ids=["check", "fix"])
def test_findings_of_a_file_with_a_star_import_are_never_cached(fix):
    """A star import is resolved through the files beside the script: the findings depend
    on more than the file's bytes, with or without ``--fix``."""
    from dp2ddp.check.engine import check_bytes

    src = (
        b"from helpers import *\nfrom torch.utils.data import DataLoader, DistributedSampler\n\n"
        b"loader = DataLoader(ds, batch_size=64, shuffle=True, sampler=DistributedSampler(ds))\n"
    )
    result = check_bytes(src, "train.py", ["DDP003"], fix=fix)
    assert result.diagnostics or result.output is not None
    assert result.store is None
