"""``magnetar standalone`` as a real process: it serves /healthz on the address it is given and
shuts down gracefully on SIGTERM (exit code 0, storage checkpointed)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import httpx

from consumers.cli.tokens import create_token
from tests.standalone import free_port, standalone_command, standalone_process, wait_healthy


def test_standalone_serves_healthz_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    proc = subprocess.Popen(standalone_command(data_dir, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        response = wait_healthy(f"http://127.0.0.1:{port}/healthz", proc)
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
        docs = httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=5.0).json()
        assert "/healthz" in docs["paths"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert (data_dir / "bookie" / "journal" / "lastMark").exists()  # closed by checkpoint
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_standalone_reads_pulsar_style_config_with_token_auth(tmp_path: Path) -> None:
    secret = b"k" * 32
    (tmp_path / "secret.key").write_bytes(secret)
    conf = tmp_path / "standalone.conf"
    conf.write_text(f"authenticationEnabled=true\nsuperUserRoles=admin\ntokenSecretKey=file://{tmp_path}/secret.key\n"
                    "clusterName=standalone\n")
    with standalone_process(tmp_path / "data", "--config", str(conf)) as (url, _):
        produce = f"{url}/topics/persistent/public/default/conf-test"
        body = {"messages": [{"payload": "x"}]}
        assert httpx.post(produce, json=body, timeout=10).status_code == 401
        token = create_token("admin", secret_key=secret)
        assert httpx.post(produce, json=body, headers={"Authorization": f"Bearer {token}"},
                          timeout=10).status_code == 200


def test_standalone_warns_once_about_keys_it_does_not_use(tmp_path: Path) -> None:
    conf = tmp_path / "standalone.conf"
    conf.write_text("clusterName=standalone\nallowAutoTopicCreaton=false\nwebServicePort=1\n")
    log_path = tmp_path / "broker.log"
    with log_path.open("wb") as log, standalone_process(tmp_path / "data", "--config", str(conf), output=log):
        pass
    lines = [line for line in log_path.read_text().splitlines() if "does not use" in line]
    assert len(lines) == 1, log_path.read_text()
    assert " WARNING api.config: " in lines[0] and "allowAutoTopicCreaton, clusterName" in lines[0]


def test_standalone_refuses_a_bad_config_with_a_clear_message(tmp_path: Path) -> None:
    conf = tmp_path / "standalone.conf"
    conf.write_text("authenticationEnabled=true\n")
    result = subprocess.run(standalone_command(tmp_path / "data", free_port(), "--config", str(conf)),
                            capture_output=True, timeout=60, check=False)
    assert result.returncode == 2
    assert b"tokenSecretKey" in result.stderr


def test_docs_list_every_family_of_endpoints(tmp_path: Path) -> None:
    with standalone_process(tmp_path / "data") as (url, _):
        docs = httpx.get(f"{url}/docs", timeout=10)
        assert docs.status_code == 200 and "swagger" in docs.text.lower()
        paths = httpx.get(f"{url}/openapi.json", timeout=10).json()["paths"]
    expected = [
        "/healthz", "/metrics",
        "/topics/persistent/{tenant}/{namespace}/{topic}",  # REST produce
        "/topics/persistent/{tenant}/{namespace}/{topic}/partitions/{partition}",
        "/topics/persistent/{tenant}/{namespace}/{topic}/messages",  # range reads
        "/topics/persistent/{tenant}/{namespace}/{topic}/offsets",
        "/topics/persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}/pull",
        "/topics/persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}/ack",
        "/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}",
        "/ws/v2/consumer/persistent/{tenant}/{namespace}/{topic}/{subscription}",
        "/ws/v2/reader/persistent/{tenant}/{namespace}/{topic}",
        "/ws/v3/consumer/{subscription}",
        "/admin/v2/tenants", "/admin/v2/namespaces/{tenant}",
        "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}",
        "/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats",
        "/admin/v2/persistent/{tenant}/{namespace}/{topic}/internalStats",
        "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}/resetcursor/{timestamp}",
    ]
    missing = [p for p in expected if p not in paths]
    assert not missing, f"not in /docs: {missing}; documented: {sorted(paths)}"
    assert all(op.get("summary") for ops in paths.values() for op in ops.values() if isinstance(op, dict))


class _References(HTMLParser):
    """Every URL a page loads from its markup: ``src``, ``href`` and ReDoc's ``spec-url``."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href", "spec-url") and value]


def page_references(html: str) -> list[str]:
    found = _References()
    found.feed(html)
    return found.urls + re.findall(r"\burl: '([^']+)'", html)  # Swagger UI's spec, set in its inline script


def test_docs_render_from_assets_the_broker_serves_itself(tmp_path: Path) -> None:
    """/docs and /redoc name nothing but this broker, and it serves every script, style, icon and
    spec they load: they render on a machine without a network."""
    expected_types = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}
    with standalone_process(tmp_path / "data") as (url, _):
        for page in ("/docs", "/redoc"):
            html = httpx.get(f"{url}{page}", timeout=10).text
            assert "//" not in re.sub(r"<!--.*?-->", "", html, flags=re.DOTALL).replace("window.location.origin", ""), \
                f"{page} names another host"
            references = page_references(html)
            assert len(references) >= 3 and "/openapi.json" in references, references
            for reference in references:
                assert reference.startswith("/"), reference
                answer = httpx.get(f"{url}{reference}", timeout=30)
                assert answer.status_code == 200, (page, reference, answer.status_code)
                assert expected_types[Path(reference).suffix] in answer.headers["content-type"], reference
                assert len(answer.content) > 1000, reference
