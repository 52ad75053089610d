"""The render hook: an env's ``render_web`` shapes what ``/web`` shows (HTML in a sandboxed
frame, legal actions as buttons), on a real server, read through HTTP and in headless Chromium."""

from __future__ import annotations

import html

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server
from envsdk.web import WebView


class RenderedEcho(EchoEnvironment):
    """The echo env with a render hook."""

    @staticmethod
    def render_web(observation: EchoObservation) -> WebView:
        return WebView(
            html=f"<h1 id='said'>{html.escape(observation.echoed_message)}</h1>",
            actions=["left", "right", "done"],
        )


@pytest.mark.timeout(60)
def test_render_route_uses_the_hook_or_the_observations_text() -> None:
    with running_server(create_app(RenderedEcho, EchoAction, EchoObservation)) as url:
        view = httpx.post(f"{url}/web/api/render", json={"observation": {"echoed_message": "<b>hi</b>"}}, timeout=5)
        assert view.json() == {"text": None, "html": "<h1 id='said'>&lt;b&gt;hi&lt;/b&gt;</h1>", "actions": ["left", "right", "done"]}
        bad = httpx.post(f"{url}/web/api/render", json={"observation": {"message_length": "many"}}, timeout=5)
        assert bad.status_code == 422 and "EchoObservation" in bad.text
    with running_server(create_app(EchoEnvironment, EchoAction, EchoObservation)) as url:
        view = httpx.post(f"{url}/web/api/render", json={"observation": {"echoed_message": "hi"}}, timeout=5).json()
        assert view["html"] is None and '"echoed_message": "hi"' in view["text"] and view["actions"] == []


@pytest.mark.timeout(90)
def test_page_shows_the_hooks_html_and_plays_its_legal_actions(browser: WebDriver) -> None:
    with running_server(create_app(RenderedEcho, EchoAction, EchoObservation)) as url:
        browser.get(f"{url}/web")
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        browser.find_element(By.ID, "reset-btn").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#legal-actions button")) == 3)
        frame = browser.find_element(By.ID, "obs-html")
        assert frame.is_displayed() and frame.get_attribute("sandbox") == ""
        browser.find_elements(By.CSS_SELECTOR, "#legal-actions button")[1].click()
        assert browser.find_element(By.ID, "action-text").get_attribute("value") == "right"
        browser.find_element(By.ID, "step-btn").click()
        wait.until(lambda d: d.find_element(By.ID, "step-count").text == "1")
        browser.switch_to.frame(frame)
        assert browser.find_element(By.ID, "said").text == "right"
        browser.switch_to.default_content()
