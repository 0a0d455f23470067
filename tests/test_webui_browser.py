"""The web chat page in a real headless Chromium (Debian's `chromium`, driven by Playwright), against a live
`ember serve` on the tiny random-weight chat model: the page loads, a message streams an answer, stop
mid-answer ends the request (the server counts an abort in /metrics), a hostile answer forced by a grammar
renders inert, stored markdown renders with highlighted code, a copy button and folded reasoning. Saves
docs/webui.png.

Not in CI (the CI machine has no Chromium): `./tools/test --browser` (installs playwright, the `browser`
extra, when missing; needs `apt-get install chromium`)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = Path(__file__).parents[1] / "docs" / "webui.png"
HOSTILE = "<img src=x onerror='window.__pwned=1'><script>window.__pwned=2</script> plain words"
STORED = [
    {
        "id": "seeded",
        "title": "Seeded markdown",
        "messages": [
            {"role": "user", "content": "Show me a Python function."},
            {
                "role": "assistant",
                "reasoning": "The user wants a short example.",
                "content": "Here is **one**:\n\n```python\ndef add(a, b):\n    return a + b\n```\n",
                "stats": "24 tokens · TTFT 0.12 s · 30.0 tok/s",
                "toolCalls": [],
            },
        ],
    }
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright  # the `browser` extra (./tools/test --browser installs it)

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1100, "height": 720})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.errors = errors
    yield page
    context.close()


def aborted_count(server) -> float:
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    match = re.search(r'^ember:request_success_total\{finished_reason="abort"\} (\S+)$', metrics, re.M)
    return float(match.group(1)) if match else 0.0


def wait_until(page, condition, timeout: float = 30) -> None:
    """Poll from Python (the page's CSP forbids the string evaluation wait_for_function uses)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        page.wait_for_timeout(100)


def set_max_tokens(page, value: int) -> None:
    if page.get_attribute("#settings", "open") is None:
        page.click("#settings summary")  # the settings panel starts folded
    page.fill("#max_tokens", str(value))
    page.dispatch_event("#max_tokens", "change")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def test_page_loads_and_streams_an_answer(page, server):
    page.goto(server.url + "/")
    wait_until(page, lambda: page.text_content("#model-name") != "…")
    assert page.text_content("#context-length") == "context 2048 tokens"
    set_max_tokens(page, 12)
    send(page, "Hello there")
    page.wait_for_selector(".message.assistant .stats", timeout=120_000)
    answer = page.text_content(".message.assistant .content")
    stats = page.text_content(".message.assistant .stats")
    assert answer.strip(), "no answer text"
    assert re.match(r"\d+ tokens · TTFT [\d.]+ s", stats), stats
    stored = json.loads(page.evaluate("localStorage.getItem('ember.conversations')"))
    assert stored[0]["messages"][0]["content"] == "Hello there"
    assert stored[0]["messages"][1]["role"] == "assistant" and stored[0]["messages"][1]["content"].strip()
    assert not page.errors, page.errors  # no script error, no CSP violation


def test_stop_mid_answer_aborts_the_request(page, server):
    before = aborted_count(server)
    page.goto(server.url + "/")
    set_max_tokens(page, 1500)
    send(page, "Write a very long story.")
    wait_until(page, lambda: len(page.text_content(".message.assistant .content") or "") > 20, 120)
    page.click("#stop")
    page.wait_for_selector(".message.assistant .error", timeout=30_000)
    assert page.text_content(".message.assistant .error") == "Stopped."
    assert page.is_visible("#send") and not page.is_visible("#stop")
    deadline = time.monotonic() + 30
    while aborted_count(server) <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert aborted_count(server) == before + 1  # the server saw the client leave and aborted the generation
    assert httpx.get(server.url + "/v1/capacity", timeout=30).json()["active"] == 0


def test_hostile_answer_renders_inert(page, server):
    """A grammar forces the model to answer with an onerror image and a script; the page shows it as
    sanitized markup: neither runs, neither element survives with its payload."""
    schema = {"type": "string", "enum": [HOSTILE]}

    def force(route):
        body = json.loads(route.request.post_data)
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/chat/completions", force)
    page.goto(server.url + "/")
    set_max_tokens(page, 200)
    send(page, "Say something dangerous.")
    page.wait_for_selector(".message.assistant .stats", timeout=180_000)
    content = page.locator(".message.assistant .content").last
    assert "plain words" in content.text_content()
    assert content.locator("script").count() == 0
    assert content.locator("[onerror]").count() == 0
    page.wait_for_timeout(500)  # an img load error would have fired by now
    assert page.evaluate("window.__pwned") is None


def test_stored_markdown_renders_with_highlighted_code_and_folded_reasoning(page, server):
    page.goto(server.url + "/")
    page.evaluate(f"localStorage.setItem('ember.conversations', {json.dumps(json.dumps(STORED))})")
    page.reload()
    answer = page.locator(".message.assistant").first
    assert answer.locator("strong").text_content() == "one"
    code = answer.locator("pre code")
    assert "hljs" in code.get_attribute("class") and code.locator(".hljs-keyword").count() >= 1
    assert answer.locator("pre button.copy").text_content() == "Copy"
    reasoning = answer.locator("details.reasoning")
    assert reasoning.get_attribute("open") is None  # folded
    assert not reasoning.locator(".reasoning-text").is_visible()
    set_max_tokens(page, 16)
    send(page, "Hello again")  # a live answer below the stored one, for the screenshot
    page.wait_for_selector(".message.assistant >> nth=1 >> .stats", timeout=120_000)
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    assert SCREENSHOT.stat().st_size < 400_000
