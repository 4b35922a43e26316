"""The MLflow UI in a real browser: a tiny training run and its evaluation, as a user finds them.

``mlflow server`` on 127.0.0.1 (a free port) serves a store holding one tiny run of
``train.py`` and ``scripts/evaluate.py``; headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium) opens the experiment from the link training logs,
finds the run by its name, and checks what a user looks for first: in the runs list, the
datasets the run trained on and its logged model; on the run's page, the model-training view,
the metric sections led by Dice, the evaluation and Loss, a per-epoch Dice chart drawn, and an
evaluation overlay PNG shown from the artifacts; under Models, the model training registered
(``tracking.register_as``). Screenshots of each
page are saved under the test's tmp dir (their paths are printed: ``pytest -s``).

``.ci/run`` installs Chromium, so in CI (``CI`` set) a missing browser fails the test; a
machine without it skips with the reason.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from brats_seg.tracking.store import LOCAL_UI, ui_url
from tests.conftest import skip_outside_ci
from tests.integration.scripts import REPO, run_script

PAGE_TIMEOUT_S = 90  # the first page of a cold server on 2 busy cores takes ~10-20 s
SERVER_START_S = 180
REGISTERED = "brats-ui-test"  # tracking.register_as of the test's run


def _browser() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    why = "no Chromium/ChromeDriver on PATH (Debian: apt-get install chromium chromium-driver; .ci/run does it)"
    skip_outside_ci(why)  # raises: a skip, or under CI a failure


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"mlflow server did not answer at {url} within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


def _logged_link(run_dir: Path, run_id: str) -> str:
    """The link to the run that training wrote to its log (``train.log``)."""
    for line in (run_dir / "train.log").read_text().splitlines():
        for word in line.split():
            if word.startswith(LOCAL_UI) and run_id in word:
                return word
    pytest.fail(f"train.log in {run_dir} gives no link to run {run_id}")


def _view(browser) -> str:
    """Which of MLflow's views the navigation shows: "model training" (runs, models) or "genai"."""
    from selenium.webdriver.common.by import By

    items = {e.text.strip() for e in browser.find_elements(By.CSS_SELECTOR, "nav a, nav [role=button]")}
    if {"Runs", "Models"} <= items and "Judges" not in items:
        return "model training"
    return "genai" if "Judges" in items or "Observability" in items else f"unknown: {sorted(items)}"


def _chromium(chromium: str, driver: str, profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    # As root in a container, without a GPU, and without the background connections a closed
    # network refuses; a profile of its own so that no earlier choice of the user's carries over.
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1600,1200",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service(driver))
    browser.set_page_load_timeout(PAGE_TIMEOUT_S)
    return browser


@pytest.mark.browser
def test_a_run_and_its_evaluation_in_the_mlflow_ui(tmp_path):
    chromium, driver = _browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    db = tmp_path / "mlruns.db"
    uri = f"sqlite:///{db}"
    run_dir = tmp_path / "run"
    run_script(
        [
            str(REPO / "train.py"),
            "resolution=tiny",
            "data=synthetic",
            f"data.root={tmp_path / 'synthetic'}",
            "data.synthetic_cases=5",
            f"data.cache_dir={tmp_path / 'cache'}",
            "model.depth=2",
            "model.base_filters=4",
            "trainer.epochs=2",
            "trainer.batch_size=1",
            f"run_dir={run_dir}",
            f"tracking.uri={uri}",
            "tracking.system_metrics=false",
            f"tracking.register_as={REGISTERED}",
        ],
        cwd=tmp_path,
    )
    run_script([str(REPO / "scripts" / "evaluate.py"), f"run_dir={run_dir}"], cwd=tmp_path)
    tracked = json.loads((run_dir / "mlflow.json").read_text())
    overlay = sorted((run_dir / "eval" / "test" / "overlays").glob("*.png"))[0].name

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                uri,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    browser = None
    shots = []

    def shot(name: str) -> None:
        shots.append(tmp_path / f"{len(shots) + 1}_{name}.png")
        browser.save_screenshot(str(shots[-1]))

    try:
        _wait_for_server(base, server, log)
        browser = _chromium(chromium, driver, tmp_path / "chromium-profile")
        wait = WebDriverWait(browser, PAGE_TIMEOUT_S)

        # The experiment's page: the model-training view lists the run, with the datasets it
        # trained on (the train split first, named with its digest; the other splits behind "+2")
        # and the model it logged.
        browser.get(ui_url(uri, tracked["experiment_id"], server=base))
        run_link = wait.until(ec.element_to_be_clickable((By.LINK_TEXT, tracked["run_name"])))
        row = f"[role='row'][row-id='{tracked['run_id']}']"
        datasets = wait.until(
            lambda _: browser.find_elements(
                By.CSS_SELECTOR, f"{row} [col-id='attributes.`Dataset`'] [data-testid='open-dataset-drawer']"
            )
        )
        models = browser.find_elements(By.CSS_SELECTOR, f"{row} [col-id='attributes.`Models`'] a[href*='/models/']")
        shot("experiment")
        assert _view(browser) == "model training"
        assert datasets[0].get_attribute("textContent").startswith("synthetic/train ("), datasets[0].get_attribute(
            "textContent"
        )
        assert [m.get_attribute("textContent") for m in models] == ["model"]
        run_link.click()

        # The run's metric charts: sections led by Dice, the evaluation and Loss; a Dice chart drawn.
        wait.until(
            ec.element_to_be_clickable((By.XPATH, "//*[@role='tab'][normalize-space()='Model metrics']"))
        ).click()
        dice_chart = wait.until(
            ec.presence_of_element_located(
                (By.XPATH, "//*[@data-testid='experiment-view-compare-runs-card'][.//h4[@title='Dice/val_mean']]")
            )
        )
        wait.until(lambda _: dice_chart.find_elements(By.CSS_SELECTOR, ".scatterlayer .trace"))  # plotly drew it
        headers = browser.find_elements(By.CSS_SELECTOR, "[data-testid='experiment-view-compare-runs-section-header']")
        sections = dict(h.text.split("\n")[:2] for h in headers)  # name -> "(number of charts)"
        shot("model_metrics")
        assert list(sections)[:3] == ["Dice", "Eval test", "Loss"], sections
        assert sections.get("Model metrics", "(0)") == "(0)", sections  # nothing in MLflow's catch-all section

        # The artifacts: an evaluation overlay opens as an image.
        browser.find_element(By.XPATH, "//*[@role='tab'][normalize-space()='Artifacts']").click()
        for name in ("eval", "test", "overlays", overlay):
            wait.until(
                ec.element_to_be_clickable(
                    (By.CSS_SELECTOR, f"[data-testid='artifact-tree-node'][artifact-name='{name}']")
                )
            ).click()
        wait.until(ec.presence_of_element_located((By.XPATH, f"//*[normalize-space()='eval/test/overlays/{overlay}']")))
        png = (run_dir / "eval" / "test" / "overlays" / overlay).read_bytes()
        size = [int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")]  # the PNG header's
        shown = wait.until(
            lambda _: browser.execute_script(  # the preview, decoded (from a blob: URL)
                "return Array.from(document.images).filter(i => i.complete && i.naturalWidth === arguments[0]"
                " && i.naturalHeight === arguments[1] && i.getBoundingClientRect().width > 200).length",
                *size,
            )
        )
        shot("overlay")
        assert shown == 1

        # The Model Registry lists the model training registered.
        browser.get(f"{base}/#/models")
        wait.until(ec.element_to_be_clickable((By.LINK_TEXT, REGISTERED)))
        wait.until(ec.presence_of_element_located((By.LINK_TEXT, "Version 1")))  # the run's model, its first version
        shot("registry")

        # The run's own link, as training logs it, opens in the model-training view too.
        browser.get(_logged_link(run_dir, tracked["run_id"]).replace(LOCAL_UI, base))
        wait.until(ec.element_to_be_clickable((By.XPATH, "//*[@role='tab'][normalize-space()='Model metrics']")))
        assert _view(browser) == "model training"
        shot("run_link")
    finally:
        if browser is not None:
            if not shots or not shots[-1].name.endswith("run_link.png"):
                shot("failed")
            browser.quit()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        print("screenshots:", *shots, sep="\n  ")
