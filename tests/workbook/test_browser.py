"""Every notebook, run in a real browser: JupyterLab in headless Chromium, driven by Playwright.

A JupyterLab server (token, local free port, ``--allow-root`` when root) serves copies of the
notebooks from a temporary folder (running cells never writes into the repository). For each
notebook a fresh page opens it, runs all cells with JupyterLab's own "Run All" command in the
notebook's kernel (the registered ``minimax_lab`` kernel), waits until they are done and checks:

* the kernel is the registered one, and every non-empty code cell ran;
* no cell has an error output, and no dialog (kernel error, missing kernel...) ever opened;
* every widget output rendered as a widget: no "Error displaying widget", no error widget, no
  "Loading widget..." left; an ``explore`` output (a widget view with a PNG fallback) shows its
  controls (sliders/dropdowns) and its picture;
* every plot cell shows at least one loaded image, and a picker's first picture is not drawn a
  second time beside it. A *plot cell* is a code cell that calls ``plt.show()`` or one of the
  workbook's pickers (``explore``, ``explore_attention``, any ``explore_*``) unconditionally: as a
  statement of the cell or inside a ``with``/``for`` block, not inside a ``def``/``class`` body or
  an ``if``/``try``/``while`` branch (a branch may draw only at some presets). That is how the
  notebooks show a picture, so such a cell that shows none has lost its picture.

Chromium comes from the system packages (Debian ``chromium``; ``.ci/run`` installs it) and is
started by Playwright through ``executable_path``: Playwright never downloads a browser here. In
CI (``CI`` set) a missing Chromium, Playwright or kernel fails the test; elsewhere it skips,
saying what is missing. ``test_browser_checks_catch_breakage`` runs a small broken notebook to
show that each check can fail.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.notebook_rules import KERNEL_NAME, budget_seconds, load, notebooks

NOTEBOOKS = notebooks()
IDS = [p.stem for p in NOTEBOOKS]
CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser")
#: The machine's network refuses Chromium's own background connections: keep it from trying.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: JupyterLab settings for the test server: every cell stays in the page (no windowing, so each
#: output can be inspected), and no news or update checks (no network here).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CONTROLS = ".widget-slider, .widget-dropdown, .widget-toggle-buttons, .widget-checkbox, .widget-text"
#: Beyond a notebook's CPU budget, room for JupyterLab, the browser and a loaded CI machine.
SLACK_S = 120


def _require(ok: bool, reason: str) -> None:
    """Fail in CI (where the test must run), skip elsewhere, saying what is missing."""
    if not ok:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)


def chromium_path() -> str | None:
    for name in CHROMIUM:
        found = shutil.which(name)
        if found:
            return found
    return None


# ---- which cells must show a picture ----------------------------------------------------------

def _is_picture_call(node: ast.Call) -> bool:
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if name == "show":  # plt.show() / pyplot.show()
        return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("plt", "pyplot")
    return name == "explore" or name.startswith("explore_")


def _unconditional_calls(body: list[ast.stmt]):
    """The calls that run whenever these statements run: those of plain statements and of the
    bodies of ``with`` and ``for`` blocks; not those in ``def``/``class`` bodies or in branches
    (``if``, ``try``, ``while``, ``match``), which may not run at a given preset."""
    for stmt in body:
        if isinstance(stmt, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor)):
            yield from _unconditional_calls(stmt.body)
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.Try,
                                   ast.While, ast.Match) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())):
            yield from (node for node in ast.walk(stmt) if isinstance(node, ast.Call))


def is_plot_cell(source: str) -> bool:
    """True for a code cell that unconditionally calls plt.show() or an explore picker."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics: fall back to the text, unindented lines only
        return bool(re.search(r"^(plt\.show\(|[\w.]*explore\w*\()", source, re.M))
    return any(_is_picture_call(call) for call in _unconditional_calls(tree.body))


def test_plot_cell_definition():
    assert is_plot_cell("fig, ax = plt.subplots()\nax.plot([1])\nplt.tight_layout(); plt.show()")
    assert is_plot_cell("for k in range(2):\n    plt.plot([k])\n    plt.show()")
    assert is_plot_cell("explore(draw, a=[1, 2])") and is_plot_cell("view = amaps.explore_attention(b, a)")
    assert is_plot_cell("%time x = 1\nplt.show()")  # magics: read as text
    assert not is_plot_cell("def draw():\n    plt.show()")  # defined, not called
    assert not is_plot_cell("if P == 'gpu':\n    plt.show()")  # only at some presets
    assert not is_plot_cell("print('no picture')") and not is_plot_cell("fig.show()")


# ---- the server and the browser ---------------------------------------------------------------

@dataclass
class Lab:
    url: str
    token: str
    root: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    _require(_has_module("jupyterlab"), "JupyterLab is not installed (pip install -r requirements.txt)")
    from jupyter_client.kernelspec import KernelSpecManager  # deferred: JupyterLab is optional (skipped without it)

    _require(KERNEL_NAME in KernelSpecManager().find_kernel_specs(),
             f"the Jupyter kernel {KERNEL_NAME!r} is not registered: run `make setup`")
    base = tmp_path_factory.mktemp("lab")
    root, settings = base / "notebooks", base / "settings"
    root.mkdir()
    for name, value in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("MINIMAX_LAB_STATIC", "MPLBACKEND")}
    env.update(JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"), TQDM_MININTERVAL="5")
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(base / "jupyterlab.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{(base / 'jupyterlab.log').read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer in 90 s:\n{(base / 'jupyterlab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield Lab(url, token, root)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@pytest.fixture(scope="module")
def browser():
    executable = chromium_path()
    _require(executable is not None, "Chromium is not installed (Debian: `apt-get install -y chromium`)")
    _require(_has_module("playwright"), "Playwright is not installed (pip install -r requirements.txt)")
    from playwright.sync_api import sync_playwright  # deferred: Playwright is optional (skipped without it)

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


# ---- running one notebook --------------------------------------------------------------------

FIND_PANEL = """
const findPanel = (path) => Array.from(window.jupyterapp.shell.widgets('main'))
    .find(w => w.context && w.context.path === path);
const within = (promise, seconds, what) => Promise.race([promise, new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`${what}: not within ${seconds} s`)), seconds * 1000))]);
"""
START_RUN_ALL = FIND_PANEL + """
async (path) => {
  const app = window.jupyterapp;
  await within(app.restored, 120, 'JupyterLab start');
  let panel = findPanel(path);
  for (let i = 0; !panel && i < 600; i++) {
    await new Promise(r => setTimeout(r, 100));
    panel = findPanel(path);
  }
  if (!panel) throw new Error(`${path} did not open`);
  await within(panel.context.ready, 120, `opening ${path}`);
  await within(panel.sessionContext.ready, 120, `starting the kernel of ${path}`);
  app.shell.activateById(panel.id);
  window.__runAll = {done: false};
  app.commands.execute('notebook:run-all-cells').then(
    ok => { window.__runAll = {done: true, ok: ok}; },
    err => { window.__runAll = {done: true, ok: false, error: String(err)}; });
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return kernel ? kernel.name : null;
}
"""
RUN_STATUS = FIND_PANEL + """
(path) => {
  const panel = findPanel(path);
  const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return {run: window.__runAll || {done: false}, kernel: kernel ? kernel.status : null,
          dialogs: Array.from(document.querySelectorAll('.jp-Dialog')).map(d => d.innerText.slice(0, 600))};
}
"""
WIDGETS_SETTLED = """() => !document.body.innerText.includes('Loading widget...')"""
REPORT = FIND_PANEL + """
(args) => {
  const [path, controls] = args;
  const panel = findPanel(path);
  if (!panel) return [];
  const loadedImages = node => Array.from(node.querySelectorAll('img'))
      .filter(img => img.complete && img.naturalWidth > 0).length;
  return panel.content.widgets.map((cell, index) => {
    const code = cell.model.type === 'code';
    // The output area's i-th child shows the i-th output.
    const shown = code ? cell.outputArea.widgets : [];
    const outputs = code ? cell.model.outputs.toJSON().map((o, i) => {
      const node = shown[i] ? shown[i].node : document.createElement('div');
      const text = node.innerText || '';
      return {
        type: o.output_type, mimes: Object.keys(o.data || {}),
        error: o.output_type === 'error' ? `${o.ename}: ${o.evalue}` : null,
        // a widget the kernel closed (a finished tqdm bar with leave=False) is hidden
        closed: node.querySelector('.jp-OutputArea-output.lm-mod-hidden') !== null,
        widgets: node.querySelectorAll('.jupyter-widgets').length,
        widgetErrors: node.querySelectorAll('.jupyter-widgets-error-widget').length
                      + (text.match(/Error displaying widget/g) || []).length,
        loading: text.includes('Loading widget...'),
        controls: node.querySelectorAll(controls).length,
        images: loadedImages(node),
      };
    }) : [];
    return {index, code, source: cell.model.sharedModel.getSource(),
            ran: code ? cell.model.executionCount !== null : null, outputs};
  });
}
"""
SHUTDOWN = FIND_PANEL + """
async (path) => { const panel = findPanel(path); if (panel) await panel.sessionContext.shutdown(); }
"""


def run_in_browser(browser, lab: Lab, notebook: Path, timeout_s: float, after_run=None) -> dict:
    """Open ``notebook`` (copied into the server's folder) in a fresh page, run all cells, and
    return what the page shows: kernel, finished, seconds, dialogs seen, page errors, cells, and
    what ``after_run(page)`` returned (called once the cells are done)."""
    (lab.root / notebook.name).write_text(json.dumps(json.loads(notebook.read_text())))  # must be JSON
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)[:300]))
    dialogs: list[str] = []
    t0 = time.monotonic()
    try:
        page.goto(f"{lab.url}/lab/tree/{notebook.name}?token={lab.token}&reset", wait_until="domcontentloaded")
        page.wait_for_function("() => window.jupyterapp !== undefined", timeout=120_000)
        kernel, finished, start_error = None, False, None
        try:
            kernel = page.evaluate(START_RUN_ALL, notebook.name)
        except Exception as e:  # noqa: BLE001 - the page could not run it: say why, with any dialog
            start_error, timeout_s = str(e).splitlines()[0][:300], 0
        while time.monotonic() - t0 < timeout_s:
            status = page.evaluate(RUN_STATUS, notebook.name)
            dialogs += [d for d in status["dialogs"] if d not in dialogs]
            if status["run"]["done"] and status["kernel"] == "idle":
                finished = True
                break
            time.sleep(1)
        seconds = time.monotonic() - t0
        try:
            page.wait_for_function(WIDGETS_SETTLED, timeout=30_000)
        except Exception:  # noqa: BLE001 - reported by the widget checks below
            pass
        after = after_run(page) if after_run and finished else None
        cells = page.evaluate(REPORT, [notebook.name, CONTROLS])
        dialogs += [d for d in page.evaluate(RUN_STATUS, notebook.name)["dialogs"] if d not in dialogs]
        page.evaluate(SHUTDOWN, notebook.name)
    finally:
        page.close()
    return {"kernel": kernel, "finished": finished, "start_error": start_error, "seconds": seconds,
            "dialogs": dialogs, "page_errors": page_errors, "cells": cells, "after_run": after}


def browser_problems(report: dict, *, kernel: str = KERNEL_NAME) -> list[str]:
    """What went wrong in a notebook run in the browser (empty list = all good)."""
    problems = []
    if report["start_error"]:
        problems.append(f"could not run all cells: {report['start_error']}")
    if report["kernel"] != kernel:
        problems.append(f"kernel {report['kernel']!r} instead of {kernel!r}")
    if not report["finished"]:
        problems.append(f"not finished after {report['seconds']:.0f} s")
    problems += [f"dialog: {d!r}" for d in report["dialogs"]]
    for cell in report["cells"]:
        if not cell["code"] or not cell["source"].strip():
            continue
        where = f"cell {cell['index']} ({cell['source'].strip().splitlines()[0][:60]!r})"
        if not cell["ran"]:
            problems.append(f"{where} did not run")
        problems += [f"{where} raised {o['error']}" for o in cell["outputs"] if o["error"]]
        widgets = [o for o in cell["outputs"] if WIDGET_VIEW in o["mimes"] and not o["closed"]]
        broken = [o for o in widgets if o["widgetErrors"] or o["loading"] or not o["widgets"]]
        if broken:
            problems.append(f"{where}: {len(broken)} of {len(widgets)} widgets not rendered "
                            f"({sum(o['widgetErrors'] for o in broken)} errors, "
                            f"{sum(o['loading'] for o in broken)} still loading)")
        pickers = [o for o in widgets if "image/png" in o["mimes"]]
        if any(not (o["controls"] and o["images"]) for o in pickers):
            problems.append(f"{where}: a picker without controls or picture "
                            f"({[(o['controls'], o['images']) for o in pickers]} (controls, images))")
        extra = sum(o["images"] for o in cell["outputs"] if o not in pickers)
        if pickers and extra:
            problems.append(f"{where} shows {extra} picture(s) beside its picker, "
                            f"which already shows its first picture")
        if cell["ran"] and is_plot_cell(cell["source"]) and not sum(o["images"] for o in cell["outputs"]):
            problems.append(f"{where} is a plot cell but shows no image")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_in_jupyterlab(path, lab, browser):
    budget = budget_seconds(load(path))
    assert budget, f"{path.name} has no cpu_budget_s"
    report = run_in_browser(browser, lab, path, timeout_s=budget + SLACK_S)
    problems = browser_problems(report)
    plot_cells = sum(c["code"] and is_plot_cell(c["source"]) for c in report["cells"])
    print(f"{path.name}: {report['seconds']:.0f} s in the browser, {plot_cells} plot cells")
    assert not problems, f"{path.name} in JupyterLab:\n  " + "\n  ".join(problems) + (
        f"\n  page errors: {report['page_errors']}" if report["page_errors"] else "")


BROKEN_CELLS = [
    "import matplotlib.pyplot as plt\nfrom minimax_lab.viz.widgets import explore\n"
    "def draw(a=0):\n    plt.plot([0, a])",
    # good: a picture; a picker with its controls, and a progress bar that closes itself
    "plt.plot([0, 1])\nplt.show()",
    "explore(draw, a=range(3))\nfrom tqdm.auto import tqdm\nfor _ in tqdm(range(3), leave=False):\n    pass",
    # broken: a plot cell that draws nothing
    "plt.show()",
    # broken: the picker's first picture drawn a second time beside it
    "draw(a=0)\nplt.show()\nexplore(draw, a=range(3))",
    # broken: a widget whose frontend code does not exist
    "import ipywidgets, traitlets\n"
    "class Missing(ipywidgets.DOMWidget):\n"
    "    _model_module = traitlets.Unicode('no-such-widget-module').tag(sync=True)\n"
    "    _view_module = traitlets.Unicode('no-such-widget-module').tag(sync=True)\n"
    "    _model_name = traitlets.Unicode('NoSuchModel').tag(sync=True)\n"
    "    _view_name = traitlets.Unicode('NoSuchView').tag(sync=True)\n"
    "Missing()",
    # broken: an error, after which nothing runs
    "raise RuntimeError('boom')",
    "print('never runs')",
]
PICTURES_IN_WIDGETS = "() => Array.from(document.querySelectorAll('.jupyter-widgets img')).map(i => i.src)"


def move_first_slider(page) -> bool:
    """Press the right arrow on the first slider; True once a picture inside a widget changed."""
    before = page.evaluate(PICTURES_IN_WIDGETS)
    page.locator(".widget-slider .noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    try:
        page.wait_for_function(f"(before) => JSON.stringify(({PICTURES_IN_WIDGETS})()) !== JSON.stringify(before)",
                               arg=before, timeout=30_000)
    except Exception:  # noqa: BLE001 - a timeout means: nothing redrew
        return False
    return True


def test_browser_checks_catch_breakage(lab, browser, tmp_path):
    """A notebook with good and broken cells: each check reports exactly the broken ones, and a
    picker redraws when its slider moves (the kernel answers a real widget frontend)."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in BROKEN_CELLS])
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "Python (minimax_lab)", "language": "python"}
    path = tmp_path / "zz_broken.ipynb"
    nbformat.write(nb, path)
    report = run_in_browser(browser, lab, path, timeout_s=180, after_run=move_first_slider)
    problems = browser_problems(report)
    by_cell = {i: [p for p in problems if p.startswith(f"cell {i} ")] for i in range(len(BROKEN_CELLS))}
    assert by_cell[0] == by_cell[1] == by_cell[2] == [], problems  # the good picture and picker pass
    assert report["after_run"], "moving the picker's slider did not redraw its picture"
    assert any("plot cell but shows no image" in p for p in by_cell[3]), problems
    assert any("1 picture(s) beside its picker" in p for p in by_cell[4]), problems
    assert any("1 of 1 widgets not rendered (1 errors" in p for p in by_cell[5]), problems
    assert any("raised RuntimeError: boom" in p for p in by_cell[6]), problems
    assert any("did not run" in p for p in by_cell[7]), problems
    assert len(problems) == 5, problems
    assert browser_problems({**report, "kernel": "python3"})[0] == "kernel 'python3' instead of 'minimax_lab'"
    assert any(p.startswith("dialog") for p in browser_problems({**report, "dialogs": ["Kernel Restarting"]}))
