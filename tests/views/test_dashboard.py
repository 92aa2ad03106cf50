"""The dashboard and the inspection verbs, on the database of a real (scripted-LLM) run.

The numbers a user sees must be the database's: each test renders into a recording rich
Console and compares the text with direct SQL. The end-to-end test at the bottom drives
the real `evolve run` in a pseudo-terminal (marked `real`: it starts a small vLLM server).
"""
import io
import json
import os
import re
import shutil
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from rich.console import Console
from scripted_run import shared_run

from evolve.cli import main
from evolve.events import Event
from evolve.store.connection import readonly_engine, schema_revision
from evolve.store.database import MIGRATIONS, connect
from evolve.views.dashboard import EventTail, LiveDashboard, attach, wants_dashboard
from evolve.views.panels import View, header, screen, stacked, with_best_events
from evolve.views.snapshot import RunReader

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture
def copy(run, tmp_path) -> Path:
    """A private copy of the run for tests that write to it (its run.json points at the copy)."""
    dest = tmp_path / run.name
    shutil.copytree(run, dest)
    spec = json.loads((dest / "run.json").read_text())
    spec["db_url"] = f"sqlite:///{dest / 'evolve.db'}"
    (dest / "run.json").write_text(json.dumps(spec))
    return dest


def spec_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def sql(run_dir: Path, query: str, *args):
    with sqlite3.connect(f"file:{run_dir / 'evolve.db'}?mode=ro", uri=True) as conn:
        return conn.execute(query, args).fetchall()


def snapshot(run_dir: Path):
    reader = RunReader(run_dir, spec_of(run_dir))
    try:
        return reader.snapshot()
    finally:
        reader.close()


def render(renderable, width=150, height=None) -> str:
    console = Console(record=True, width=width, height=height, file=io.StringIO(), color_system="truecolor")
    console.print(renderable)
    return console.export_text()


def events_of(run_dir: Path) -> list[Event]:
    return [Event.from_json(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


# ---- the snapshot is the database ----------------------------------------------------------------
def test_snapshot_numbers_are_the_databases(run):
    s = snapshot(run)
    # the budget's unit, exactly as ProgramDatabase.evaluations_done counts it
    [(evals,)] = sql(run, "SELECT count(*) FROM programs WHERE origin='mutation' AND duplicate_of IS NULL "
                          "AND status IN ('ok','invalid','error','timeout')")
    assert s.evaluations == evals == 14 and s.budget == 14
    assert s.children == dict(sql(run, "SELECT status, count(*) FROM programs WHERE origin='mutation' "
                                       "GROUP BY status"))
    assert {"ok", "invalid", "error", "timeout", "mutation_failed"} <= set(s.children)
    [(best_id, best_obj, best_head)] = sql(run, "SELECT id, objective, headline FROM programs WHERE status='ok' "
                                                "ORDER BY objective DESC, id LIMIT 1")
    assert (s.best.id, s.best.objective, s.best.headline) == (best_id, best_obj, best_head)
    assert s.best.headline > s.seed_headline  # the scripted run improves on the seed
    assert s.series[-1][3] == best_id and s.series[0][0] == 0
    [(calls, tokens)] = sql(run, "SELECT count(*), sum(completion_tokens) FROM llm_calls")
    assert (s.llm_calls, s.tokens) == (calls, tokens)
    # the short run lies inside the throughput window: every answer counts in answers/min
    [(answers,)] = sql(run, "SELECT count(*) FROM programs WHERE origin='mutation'")
    assert s.throughput.answers_per_s * s.throughput.window_s == pytest.approx(answers)
    for row in s.islands:
        [(size, ok, mean)] = sql(run, "SELECT count(*), sum(status='ok'), avg(CASE WHEN status='ok' "
                                      "THEN objective END) FROM programs WHERE island=?", row.island)
        [(cells,)] = sql(run, "SELECT count(*) FROM cells WHERE island=?", row.island)
        [(gen, mig)] = sql(run, "SELECT generation, last_migration FROM islands WHERE island=?", row.island)
        assert (row.programs, row.ok, row.cells, row.generation, row.last_migration) == (size, ok, cells, gen, mig)
        assert row.mean_objective == pytest.approx(mean)
        assert 0 <= row.since_improvement <= row.generation
    cells = sql(run, "SELECT island, cell, objective FROM cells")
    assert sum(len(g) for g in s.cells.values()) == len(cells) >= 3
    for island, cell, objective in cells:
        assert s.cells[island][tuple(map(int, cell.split(",")))] == objective
    assert s.state == "stopped: budget reached" and s.rl.trains is False and s.rl.steps == 0


def test_dashboard_shows_the_databases_numbers(run):
    s = snapshot(run)
    text = render(stacked(s, events_of(run)))
    assert f"{s.evaluations}/{s.budget} evaluations" in text
    assert f"n26 = {s.best.headline:.6f}" in text and f"objective {s.best.objective:.4f}" in text
    for name in s.components:  # the best program's vector fitness, one bar per component
        assert re.search(rf"{name} [█▏▎▍▌▋▊▉ ]+ {s.best.fitness[name]:.4f} {s.best.raw[name]:.6f}", text)
    for row in s.islands:
        assert re.search(rf"\b{row.island} +{row.programs} +{row.ok} +{row.cells} +{row.best_headline:.6f} "
                         rf"+{row.best_objective:.4f} +{row.mean_objective:.4f} +{row.generation} ", text)
    for status in ("invalid", "error", "timeout"):
        assert re.search(rf"{status} +[\d.]+% +{s.children[status]} in all", text)
    assert f"{s.llm_calls} calls" in text and f"{s.tokens:,} tokens" in text
    assert "frozen policy: no training" in text
    assert f"all islands {sum(1 for _ in set().union(*[set(g) for g in s.cells.values()]))}/64" in text
    # recent events: new best with its delta, migrations; progress lines stay out
    delta = s.series[-1][2] - s.series[0][2]
    assert f"new best #{s.best.id}" in text and f"(+{delta:.4f})" in text
    assert "migration: island" in text and "[14/14 evals]" not in text


def test_live_layout_has_every_panel(run):
    s = snapshot(run)
    text = render(screen(s, events_of(run), View(), hint="keys: g q"), width=160, height=50)
    for title in ("evolve", "islands", "MAP-Elites cells", "best", "throughput", "RL hook", "recent events"):
        assert f"─ {title} " in text
    assert len(text.splitlines()) == 50  # fills the terminal, no more


def test_grid_views_switch(run):
    s = snapshot(run)
    view = View()
    assert "island 1 " in render(stacked(s, [], view))
    view.cycle(2)
    assert view.grid == "aggregate"
    only = render(stacked(s, [], view))
    assert "all islands" in only and "island 1 " not in only
    view.cycle(2)
    view.cycle(2)
    assert view.grid == 1
    view.cycle(2)
    assert view.grid == "all"


def test_heat_map_colours_follow_the_objective(run):
    s = snapshot(run)
    console = Console(record=True, width=150, file=io.StringIO(), color_system="truecolor")
    console.print(stacked(s, []))
    html = console.export_html(inline_styles=True)
    assert "#fde725" in html  # the best cell: the top of the viridis scale
    assert "#440154" in html  # the worst filled cell: its bottom


# ---- incremental refresh -------------------------------------------------------------------------
def test_refresh_reads_only_new_rows_and_counts_pending_children_once(copy):
    reader = RunReader(copy, spec_of(copy))
    first = reader.snapshot()
    before_last = reader.acc.last_program
    with sqlite3.connect(copy / "evolve.db") as conn:  # what the engine does: store pending, then score
        conn.execute("INSERT INTO programs (run_id, island, generation, origin, status, created_at, code) "
                     "VALUES (1, 0, 3, 'mutation', 'pending', ?, 'x = 1')", (time.time(),))
        pid = conn.execute("SELECT max(id) FROM programs").fetchone()[0]
    middle = reader.snapshot()
    assert pid in reader.acc.pending and middle.islands[0].programs == first.islands[0].programs + 1
    assert middle.children["pending"] == first.children.get("pending", 0) + 1
    with sqlite3.connect(copy / "evolve.db") as conn:
        conn.execute("UPDATE programs SET status='ok', objective=2.0, headline=2.9, fitness='{}', raw='{}' "
                     "WHERE id=?", (pid,))
        conn.execute("INSERT INTO evaluations (program_id, backend, status, started_at, elapsed_s) "
                     "VALUES (?, 'process', 'ok', ?, 0.5)", (pid, time.time()))
    last = reader.snapshot()
    reader.close()
    assert reader.acc.last_program == pid > before_last and pid not in reader.acc.pending
    assert last.evaluations == first.evaluations + 1
    assert last.children["ok"] == first.children["ok"] + 1
    assert last.children.get("pending", 0) == first.children.get("pending", 0)
    assert last.islands[0].programs == first.islands[0].programs + 1  # not twice
    assert last.best.id == pid and last.series[-1][3] == pid and last.islands[0].since_improvement == 0


# ---- read-only, and older databases ----------------------------------------------------------------
def old_schema_run(tmp_path: Path) -> Path:
    """A run directory whose database stopped at revision 0001 (no training_steps table)."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    db = run_dir / "evolve.db"
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    engine = connect(f"sqlite:///{db}")
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
    engine.dispose()
    problem = (ROOT / "problems" / "circle_packing.yaml").read_text()
    with closing(sqlite3.connect(db)) as conn, conn:  # closed: the WAL is folded in before we compare bytes
        conn.execute("INSERT INTO runs (id, name, problem, problem_yaml, policy_yaml, seed, created_at) "
                     "VALUES (1, 'old', 'circle_packing', ?, 'name: frozen\nmodel: m\n', 0, 0)", (problem,))
        conn.execute("INSERT INTO islands VALUES (1, 0, 0, 0)")
        conn.execute("INSERT INTO programs (run_id, island, generation, origin, status, objective, headline, "
                     "fitness, raw, created_at, code) VALUES (1, 0, 0, 'seed', 'ok', 0.8, 2.1, "
                     "'{\"n26\": 0.8}', '{\"n26\": 2.1}', 0, 'x = 1')")
        conn.execute("INSERT INTO evaluations (program_id, backend, status, started_at, elapsed_s) "
                     "VALUES (1, 'process', 'ok', 0, 1)")
    (run_dir / "run.json").write_text(json.dumps({"problem": "p.yaml", "policy": "q.yaml", "seed": 0,
                                                  "db_url": f"sqlite:///{db}", "budget": {}}))
    return run_dir


def test_inspection_never_migrates_or_writes_an_old_database(tmp_path, capsys):
    run_dir = old_schema_run(tmp_path)
    db = run_dir / "evolve.db"
    assert not Path(f"{db}-wal").exists()
    before = db.read_bytes()
    assert main(["dashboard", str(run_dir), "--once"]) == 0
    assert main(["status", str(run_dir)]) == 0
    assert main(["show", str(run_dir), "1"]) == 0
    out = capsys.readouterr().out
    assert "frozen policy: no training" in out and "#1" in out
    assert db.read_bytes() == before
    engine = readonly_engine(f"sqlite:///{db}")
    assert schema_revision(engine) == "0001"
    engine.dispose()


def test_readonly_engine_refuses_writes(run):
    engine = readonly_engine(spec_of(run)["db_url"])
    with engine.connect() as conn, pytest.raises(Exception, match="readonly"):
        conn.exec_driver_sql("DELETE FROM programs")
    engine.dispose()


def test_missing_database_is_one_line(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps({"db_url": f"sqlite:///{tmp_path / 'evolve.db'}"}))
    assert main(["status", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("no database (has the run started?)") and "\n" not in err
    assert not (tmp_path / "evolve.db").exists()  # looking did not create it


# ---- RL panel ------------------------------------------------------------------------------------
TRAIN_POLICY = "name: vpo\nmodel: m\nanswers: 3\ntrain: {algorithm: vpo}\n"


def test_rl_panel_shows_the_last_training_step(copy):
    with sqlite3.connect(copy / "evolve.db") as conn:
        conn.execute("UPDATE runs SET policy_yaml=?", (TRAIN_POLICY,))
    s = snapshot(copy)
    text = render(stacked(s, []))
    assert "vpo: no training step yet" in text and "frozen policy" not in text
    with sqlite3.connect(copy / "evolve.db") as conn:
        for v, loss in ((1, 0.25), (2, -0.125)):
            conn.execute("INSERT INTO training_steps (run_id, version, algorithm, groups, rollouts, loss, kl, "
                         "clip_fraction, mean_abs_advantage, reward_mean, train_s, load_s, peak_rss_mb, "
                         "started_at) VALUES (1, ?, 'vpo', 4, 32, ?, 0.0031, 0.05, 0.8125, 0.61, 20.5, 0.08, "
                         "7500, ?)", (v, loss, time.time()))
            conn.execute("INSERT INTO policy_versions (run_id, version, model, adapter_path, created_at) "
                         "VALUES (1, ?, 'adapter', ?, 0)", (v, f"/r/adapters/v{v}"))
    s = snapshot(copy)
    assert s.rl.steps == 2 and s.rl.version == 2 and s.rl.train_s == pytest.approx(2 * 20.58)
    text = render(stacked(s, []))
    for expected in ("vpo -> v2", "loss  -0.125", "KL  0.0031", "mean |advantage|  0.8125",
                     "clip fraction  0.050", "4 / 32", "train 20.5s, load 0.08s", "v2  v2", "2 steps, 41s"):
        assert re.search(re.escape(expected).replace(r"\ \ ", r"\s+"), text), expected
    assert "v2 (base model)" not in render(header(s))


# ---- the inspection verbs -------------------------------------------------------------------------
def test_status_best_and_show(run, capsys):
    s = snapshot(run)
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert "valid mutation rate" in out and f"{s.evaluations}/{s.budget}" in out and f"#{s.best.id}" in out
    assert main(["best", str(run)]) == 0
    assert f"#{s.best.id}" in capsys.readouterr().out
    assert main(["best", str(run), "--code"]) == 0
    assert "EVOLVE-BLOCK-START" in capsys.readouterr().out

    assert main(["show", str(run), str(s.best.id)]) == 0
    out = capsys.readouterr().out
    [(parent,)] = sql(run, "SELECT parent_id FROM programs WHERE id=?", s.best.id)
    assert f"program #{s.best.id}" in out and f"#{parent} (parent)" in out
    assert "+    k = int(np.floor(np.sqrt(n)))" in out  # the diff against its parent
    assert f"lineage: #{s.best.id} mutation" in out and "seed" in out
    assert "from LLM call #" in out and f"{s.best.objective:.4f}" in out

    [(failed,)] = sql(run, "SELECT id FROM programs WHERE status='timeout' LIMIT 1")
    assert main(["show", str(run), str(failed)]) == 0
    out = capsys.readouterr().out
    assert "timeout" in out and "error (last" in out and "time.sleep(30)" in out

    [(unapplied,)] = sql(run, "SELECT id FROM programs WHERE status='mutation_failed' LIMIT 1")
    assert main(["show", str(run), str(unapplied)]) == 0
    assert "the answer was:" in capsys.readouterr().out


def test_show_unknown_program_is_one_line_and_fails(run, capsys):
    assert main(["show", str(run), "99999"]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"evolve show {run} 99999: no program 99999 in this run\n"


def test_dashboard_once_prints_one_frame(run, capsys):
    assert main(["dashboard", str(run), "--once"]) == 0
    out = capsys.readouterr().out
    assert "MAP-Elites cells" in out and "recent events" in out and "14/14 evaluations" in out


# ---- events ----------------------------------------------------------------------------------------
def test_event_tail_follows_the_file(tmp_path):
    tail = EventTail(tmp_path)
    assert list(tail.poll()) == []
    path = tmp_path / "events.jsonl"
    path.write_text(Event("run", "one").to_json() + "\n" + Event("best", "two").to_json()[:10])
    assert [e.message for e in tail.poll()] == ["one"]  # the half-written line waits
    with open(path, "a") as f:
        f.write(Event("best", "two").to_json()[10:] + "\n")
    assert [e.message for e in tail.poll()] == ["one", "two"]


def test_event_tail_falls_back_to_an_old_log(tmp_path):
    (tmp_path / "evolve.log").write_text("18:00:22 seed: n26 = 2.166667\n")
    assert [e.message for e in EventTail(tmp_path).poll()] == ["18:00:22 seed: n26 = 2.166667"]


def test_best_events_are_not_listed_twice(run):
    s = snapshot(run)
    announced = [Event("best", "announced", {"program": s.best.id})]
    merged = with_best_events(announced, s)
    assert [e.message for e in merged if e.kind == "best"] == ["announced"]


# ---- `evolve run` on a terminal or not ------------------------------------------------------------
def test_no_dashboard_off_a_terminal(capsys):
    assert wants_dashboard(no_dashboard=False) is False  # pytest's stdout is not a terminal
    assert wants_dashboard(no_dashboard=True) is False


def test_live_dashboard_takes_events_and_stray_output_and_restores_the_terminal(run, capsys):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=150, height=48, color_system="truecolor")
    with LiveDashboard(run, spec_of(run), refresh=0.05, console=console) as sink:
        sink(Event("llm_error", "llm call failed: scripted"))
        print("a stray line from a library")
        time.sleep(0.3)
    frames = out.getvalue()
    assert "\x1b[?1049h" in frames and frames.rstrip().endswith("\x1b[?1049l")  # alternate screen, left
    assert "llm call failed: scripted" in frames and "a stray line from a library" in frames
    captured = capsys.readouterr()
    assert "a stray line from a library" in captured.err  # given back once the screen is gone
    assert "14/14 evaluations" in captured.out and "best n26" in captured.out  # the final summary


def test_attach_once_on_a_run_without_a_database_yet(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"db_url": f"sqlite:///{tmp_path / 'evolve.db'}"}))
    (tmp_path / "events.jsonl").write_text(Event("run", "starting up").to_json() + "\n")
    console = Console(record=True, width=120, file=io.StringIO())
    assert attach(tmp_path, spec_of(tmp_path), once=True, console=console) == 0
    text = console.export_text()
    assert "waiting for the run's database" in text and "starting up" in text


# ---- end to end in a pseudo-terminal -----------------------------------------------------------------
SMOL_PORT = 8131  # not the policy's default port: a server other tests start is never reused here
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")


def screens(raw: str) -> list[str]:
    """The frames rich drew, as plain text: each starts by moving the cursor home."""
    return [ANSI.sub("", part) for part in raw.split("\x1b[H")[1:]]


@pytest.fixture(scope="module")
def smol_policy(tmp_path_factory):
    """SmolLM2 with short answers (quick calls), served once for both runs of the test."""
    from evolve.config import load_policy
    from evolve.serving.models import ensure_model
    from evolve.serving.server import VLLMServer

    folder = tmp_path_factory.mktemp("smol")
    path = folder / "smol.yaml"
    path.write_text((ROOT / "policies" / "smollm2.yaml").read_text()
                    .replace("port: 8012", f"port: {SMOL_PORT}").replace("max_tokens: 256", "max_tokens: 64")
                    .replace("group_size: 4", "group_size: 2"))
    policy = load_policy(path)
    with VLLMServer(ensure_model(policy.model), policy.model, policy.server, folder / "vllm.log"):
        yield path


def spawn(pexpect, command: str):
    """A shell in a 160x50 pseudo-terminal; after the command it prints its exit status and the tty mode."""
    child = pexpect.spawn("bash", ["-c", f"{command}; echo EXIT=$?; stty -a"], cwd=str(ROOT),
                          dimensions=(50, 160), encoding="utf-8", codec_errors="replace",
                          env={**os.environ, "TERM": "xterm-256color"}, timeout=180)
    child.logfile_read = io.StringIO()
    return child


def assert_terminal_given_back(raw: str) -> str:
    """Alternate screen left, cursor shown, line editing and echo back on; returns what followed."""
    before, after = raw.rsplit("\x1b[?1049l", 1)
    assert "\x1b[?25h" in before[-20:]
    stty = after[after.index("EXIT="):]
    assert re.search(r"(?<!-)icanon", stty) and re.search(r"(?<!-)\becho\b", stty), stty
    return ANSI.sub("", after)


def test_dashboard_attaches_in_a_terminal_switches_view_and_quits(run):
    pexpect = pytest.importorskip("pexpect")
    child = spawn(pexpect, f"{sys.executable} -m evolve.cli dashboard {run} --refresh 0.2")
    child.expect(r"island 1 \d+/64")  # the grid of each island
    child.send("g")  # all islands -> the aggregate only
    child.expect("all islands")
    time.sleep(0.5)
    child.send("q")
    child.expect(r"EXIT=(\d+)")
    assert child.match.group(1) == "0"
    child.expect(pexpect.EOF)
    raw = child.logfile_read.getvalue()
    assert not re.search(r"island 1 \d+/64", screens(raw.rsplit("\x1b[?1049l", 1)[0])[-1])  # aggregate only
    assert_terminal_given_back(raw)


@pytest.mark.real
def test_evolve_run_in_a_terminal_shows_a_live_dashboard(smol_policy, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    run_dir = tmp_path / "run"
    evolve = f"{sys.executable} -m evolve.cli"
    # Short tunings: the seed's is done before the LLM's first turn, and this test is about the screen.
    # One call at a time, so the counter steps 1, 2, 3 while we watch (the default runs all three at once).
    child = spawn(pexpect, f"{evolve} run problems/circle_packing.yaml --policy {smol_policy} "
                           f"--run-dir {run_dir} --max-llm-calls 3 --set search.tuning.trials=40 "
                           f"--set budget.llm_concurrency=1")
    child.expect("waiting for the run's database|MAP-Elites cells")  # the screen is up at once
    child.expect(r"LLM calls [12]/3")  # a group answered: the panels follow the database
    child.expect(r"EXIT=(\d+)")
    assert child.match.group(1) == "0", ANSI.sub("", child.logfile_read.getvalue())[-3000:]
    child.expect(pexpect.EOF)
    raw = child.logfile_read.getvalue()
    frames = [f for f in screens(raw) if "─ islands " in f]
    last = frames[-1]
    for title in ("islands", "MAP-Elites cells", "best", "throughput", "RL hook", "recent events"):
        assert f"─ {title} " in last
    assert "frozen policy: no training" in last and "seed: n26 = 2.16666" in last
    seen = {m for f in frames for m in re.findall(r"LLM calls \d/3", f)}
    assert len(seen) >= 2 and "LLM calls 3/3" in last  # it updated while we watched
    s = snapshot(run_dir)
    assert s.llm_calls == 3 and f"{s.evaluations}/{s.budget} evaluations" in last
    after = assert_terminal_given_back(raw)
    assert f"{s.evaluations}/{s.budget} evaluations · best n26" in after
    assert "stopped: llm call budget reached" in after

    # Ctrl-C in the middle of a resumed run: the run stops cleanly and so does the screen
    child = spawn(pexpect, f"{evolve} resume {run_dir} --max-llm-calls 40")
    child.expect("MAP-Elites cells")
    child.expect(pexpect.TIMEOUT, timeout=2)  # reading on (a terminal always does) while the run starts
    child.sendintr()
    child.expect(r"EXIT=(\d+)")
    assert child.match.group(1) == "130"
    child.expect(pexpect.EOF)
    after = assert_terminal_given_back(child.logfile_read.getvalue())
    assert "stopped: interrupted" in after and "Traceback" not in after


def test_the_engine_announces_each_new_best(run):
    """The controller's own `best` events (not rebuilt from the database) reach the event log."""
    s = snapshot(run)
    bests = [e for e in events_of(run) if e.kind == "best"]
    assert bests and bests[-1].fields["program"] == s.best.id
    assert all(e.fields["delta"] > 0 for e in bests)


HOSTILE_TEXT = "\x1b[2J\x1b[H\x1b]52;c;ZXZpbA==\x07cleared\u202eexe.txt"


def test_candidate_text_reaches_the_terminal_without_control_sequences(copy, capsys):
    [(pid,)] = sql(copy, "SELECT id FROM programs WHERE status='timeout' LIMIT 1")
    with sqlite3.connect(copy / "evolve.db") as conn:
        conn.execute("UPDATE programs SET error=?, code=code || ? WHERE id=?",
                     (f"Traceback\n{HOSTILE_TEXT}", f"\n# {HOSTILE_TEXT}\n", pid))
    assert main(["show", str(copy), str(pid)]) == 0
    out = capsys.readouterr().out
    assert "cleared" in out and "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    line = Event("llm_error", f"answer: {HOSTILE_TEXT}").line()
    assert "cleared" in line and "\x1b" not in line and "\u202e" not in line


def test_mutator_quality_per_policy_version_matches_the_database(copy, capsys):
    with sqlite3.connect(copy / "evolve.db") as conn:
        conn.execute("UPDATE runs SET policy_yaml=?", (TRAIN_POLICY,))
        conn.execute("UPDATE llm_calls SET policy_version = 1 WHERE id > (SELECT max(id) / 2 FROM llm_calls)")
        truth = {v: row for v, *row in conn.execute(
            "SELECT c.policy_version, count(p.id), sum(p.status != 'mutation_failed'), sum(p.status = 'ok'), "
            "sum(p.outcome = 'better'), sum(p.outcome = 'same') FROM programs p "
            "JOIN completions k ON k.id = p.completion_id JOIN llm_calls c ON c.id = k.call_id "
            "WHERE p.origin = 'mutation' GROUP BY c.policy_version")}
        tokens = dict(conn.execute("SELECT policy_version, sum(completion_tokens) FROM llm_calls "
                                   "WHERE error IS NULL GROUP BY policy_version").fetchall())
    s = snapshot(copy)
    assert [v.version for v in s.rl.versions] == [0, 1]
    for v in s.rl.versions:
        assert [v.answers, v.applied, v.valid, v.better, v.same] == truth[v.version]
        assert v.tokens == tokens[v.version]
    assert sum(v.better for v in s.rl.versions) > 0 and sum(v.valid for v in s.rl.versions) > 0
    text = render(stacked(s, []))
    assert "mutator quality per policy version" in text
    v0 = s.rl.versions[0]
    assert re.search(rf"v0[\s│]+{v0.answers}[\s│]+{re.escape(f'{v0.applied / v0.answers:.1%}')}", text), text
    assert main(["status", str(copy)]) == 0 and "mutator quality per policy version" in capsys.readouterr().out
    assert main(["export", str(copy), "--out", str(copy / "out")]) == 0
    rows = (copy / "out" / "policy_versions.csv").read_text().splitlines()
    assert rows[0].startswith("version,calls,answers") and len(rows) == 3
    assert (copy / "out" / "policy_versions.png").stat().st_size > 0
