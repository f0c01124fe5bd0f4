"""The Setup form's field groups in a real browser: an edit inside an "Algorithm settings" group keeps it open.

Left to the browser, a group's expander closed on the rerun an edit inside it caused, hiding the field just edited
(and the two fields ``preference_source = human`` reveals). Each check opens a group, edits a field in it and
expects the group still open, its fields visible. AppTest cannot see this: the open state lives in the browser.
A server on an empty runs folder; screenshots go to ``test-artifacts/``.

Needs Debian's chromium (or its headless shell); skipped otherwise.
"""

from __future__ import annotations

import pytest
from browser_support import ARTIFACTS, BROWSER, app_driver

from comlrl_lab.ui import state

pytestmark = pytest.mark.browser

driver = app_driver()
key = driver.key


def _field(name: str) -> str:
    return key(state.config_field_key("MADPOIter", name))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("setup-groups")
    with (
        driver.AppServer(tmp / "runs", tmp / "server.log") as server,
        driver.chromium_page(tmp, executable=BROWSER) as page,
    ):
        driver.open_page(page, f"{server.url}/setup", "Set up an experiment")
        yield page


def _open_group(page, title: str):
    """Open the "Algorithm settings" group ``title``; its expander's details element."""
    group = page.locator(f"{key(state.setup_group_key(title))} details").first
    group.locator("summary").click()
    driver.wait_idle(page)
    assert group.get_attribute("open") is not None
    return group


def _still_open(page, group) -> bool:
    page.wait_for_timeout(500)  # a late redraw of the expander comes within a few frames
    driver.wait_idle(page)
    return group.get_attribute("open") is not None


def test_editing_a_training_field_keeps_its_group_open(page):
    group = _open_group(page, "Training")
    box = page.locator(f"{_field('dpo_beta')} input")
    box.fill("0.2")
    box.press("Enter")
    driver.wait_idle(page)
    assert _still_open(page, group), "the Training group closed after dpo_beta was changed"
    page.locator(f"{_field('train_batch_size')} button[data-testid='stNumberInputStepUp']").click()
    driver.wait_idle(page)
    assert _still_open(page, group), "the Training group closed after + on train_batch_size"
    assert page.locator(f"{_field('dpo_beta')} input").is_visible()


def test_choosing_human_labels_keeps_the_group_open_and_shows_what_it_needs(page):
    group = _open_group(page, "Preference source")
    driver.choose(page, state.config_field_key("MADPOIter", "preference_source"), "human")
    assert _still_open(page, group), "the Preference source group closed after choosing human"
    for name in ("labels_per_comparison", "label_guideline"):
        assert page.locator(_field(name)).first.is_visible(), f"{name} is hidden"
    driver.screenshot(page, ARTIFACTS / "setup-group-open-after-edit.png")
