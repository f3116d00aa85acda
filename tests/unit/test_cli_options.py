"""The client commands' shared options, parsed as the ``magnetar`` command parses them.

Checks: a subscription type is accepted in any case (``shared``, as REST and WebSocket take it)
and reaches the command spelled as Pulsar spells it; an unknown one is refused naming the four;
a ``pulsar://`` service URL (given or from ``$MAGNETAR_SERVICE_URL``) is refused with a usage
error that says to give the web service's ``http://`` URL, instead of failing later with
"unsupported protocol" from the HTTP library.
"""

from __future__ import annotations

import pytest

from api.cli import build_parser


@pytest.mark.parametrize(("given", "parsed"), [("shared", "Shared"), ("KEY_SHARED", "Key_Shared"),
                                               ("Failover", "Failover"), ("exclusive", "Exclusive")])
def test_a_subscription_type_is_accepted_in_any_case(given: str, parsed: str) -> None:
    for command in (["consume", "t", "-s", "sub", "-t", given], ["perf", "consume", "t", "-s", "sub", "-t", given]):
        assert build_parser().parse_args(command).subscription_type == parsed


def test_an_unknown_subscription_type_names_the_four(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["consume", "t", "-s", "sub", "-t", "fanout"])
    assert refused.value.code == 2
    assert "unknown subscription type 'fanout': use one of Exclusive, Shared, Failover, Key_Shared (any case)" in (
        capsys.readouterr().err)


def test_a_pulsar_service_url_is_refused_naming_the_http_one(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["produce", "--service-url", "pulsar://localhost:6650", "t", "-m", "x"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "pulsar://localhost:6650 is Pulsar's binary protocol" in err and "http://127.0.0.1:8080" in err, err
    monkeypatch.setenv("MAGNETAR_SERVICE_URL", "pulsar+ssl://broker:6651")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["produce", "t", "-m", "x"])
    assert "pulsar+ssl://broker:6651 is Pulsar's binary protocol" in capsys.readouterr().err
    assert build_parser().parse_args(["produce", "--service-url", "https://broker:8443", "t", "-m", "x"]).service_url \
        == "https://broker:8443"


def test_perf_takes_pulsar_perfs_letters(capsys: pytest.CaptureFixture[str]) -> None:
    """``-n`` counts producers (consumers) and ``-m`` messages, as in pulsar-perf; ``-time`` is
    the test's duration."""
    produce = build_parser().parse_args(["perf", "produce", "t", "-n", "3", "-m", "500", "-r", "100"])
    assert (produce.num_producers, produce.num_messages, produce.rate) == (3, 500, 100)
    consume = build_parser().parse_args(["perf", "consume", "t", "-s", "sub", "-n", "2", "-time", "30"])
    assert (consume.num_consumers, consume.num_messages, consume.time_s) == (2, 0, 30)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["perf", "produce", "t", "-n", "0"])
    assert "0 must be at least 1" in capsys.readouterr().err
