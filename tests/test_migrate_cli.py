"""``nobackfill migrate`` (``service.stack.migrate_cli``) against a real gateway: the app
of ``gateway_factory`` served by a real uvicorn on a free port, the CLI talking to it over
HTTP with urllib, as it does in production. Its errors (the gateway's status and message,
exit code 1), the bodies it sends (valid for the API's own model) and its status table."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from conftest import ADMIN_KEY
from test_service_probe import served

from service.stack import migrate_cli
from training.cli import build_parser


def cli(*argv: str) -> Any:
    return build_parser().parse_args(["migrate", *argv])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = migrate_cli.run(cli(*argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_is_plugged_into_nobackfill() -> None:
    args = cli("status", "--gallery", "g", "--gateway", "http://x:1", "--key", "k")
    assert args.func is migrate_cli.run
    assert (args.action, args.gallery, args.gateway, args.key) == ("status", "g", "http://x:1",
                                                                   "k")


def test_start_sends_only_what_was_given_and_the_api_takes_it() -> None:
    from service.api.schemas.migrations import MigrationIn

    assert migrate_cli.start_body(cli("start", "--gallery", "g")) == {}
    body = migrate_cli.start_body(cli(
        "start", "--gallery", "g", "--shards", "4", "--batch-size", "32", "--rate-limit", "0",
        "--transform", "--order", "learned", "--switch", "progressive", "--sample", "64",
        "--method", "affine", "--no-auto-switch", "--seed", "3"))
    assert body == {"shards": 4, "batch_size": 32, "rate_limit": 0.0, "order": "learned",
                    "switch": "progressive", "sample": 64, "seed": 3, "transform": True,
                    "transform_config": {"method": "affine"}, "auto_switch": False}
    parsed = MigrationIn.model_validate(body)
    assert parsed.transform and parsed.transform_config == {"method": "affine"}
    body = migrate_cli.start_body(cli("start", "--gallery", "g", "--serving", "rerank",
                                      "--rerank-k", "12"))
    assert body == {"serving": "rerank", "rerank_k": 12}
    assert MigrationIn.model_validate(body).serving == "rerank"
    assert cli("resume", "--gallery", "g").action == "resume"


def test_errors_of_a_real_gateway_are_printed_with_their_status(
        gateway_factory, capsys: pytest.CaptureFixture[str]) -> None:
    with gateway_factory() as client, served(client.app) as url:
        where = ("--gateway", url, "--key", ADMIN_KEY)
        # No migration of 'shapes' yet.
        code, out, err = run(capsys, "status", "--gallery", "shapes", *where)
        assert (code, out) == (1, "")
        assert err.startswith("error: 404 ") and "shapes" in err
        # v1 serves 'shapes' in its own space: nothing to migrate to.
        code, out, err = run(capsys, "start", "--gallery", "shapes", "--transform",
                             "--order", "learned", *where)
        assert code == 1 and out == ""
        assert err.startswith("error: 409 ") and "already in space 'v1'" in err, err
        # A learned order without a transform: refused by the API's model (422).
        code, _, err = run(capsys, "start", "--gallery", "shapes", "--order", "learned", *where)
        assert code == 1 and err.startswith("error: 4"), err
        assert "learned" in err and "transform" in err, err
        for action in ("switch", "rollback", "retire", "cancel"):
            code, _, err = run(capsys, action, "--gallery", "shapes", *where)
            assert code == 1, (action, err)
            assert err.startswith(("error: 409 ", "error: 404 ", "error: 422 ")), (action, err)
        # Without the admin key, or with another one.
        code, _, err = run(capsys, "status", "--gallery", "shapes", "--gateway", url)
        assert code == 1 and err.startswith("error: 401 "), err
        code, _, err = run(capsys, "status", "--gallery", "shapes", "--gateway", url,
                           "--key", "wrong")
        assert code == 1 and err.startswith("error: 40"), err
        # A gallery name that needs quoting reaches the gateway as one path segment.
        code, _, err = run(capsys, "status", "--gallery", "no/such 100%", *where)
        assert code == 1 and err.startswith("error: 404 "), err


def test_an_unreachable_gateway_is_an_error_too(capsys: pytest.CaptureFixture[str]) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    code, out, err = run(capsys, "status", "--gallery", "g", "--gateway",
                         f"http://127.0.0.1:{port}")
    assert code == 1 and out == "" and "cannot reach the gateway" in err


VIEW = {"gallery": "demo", "state": "switched", "serving_space": "v2", "version": "v2",
        "source": {"space": "v1", "collection": "c1"},
        "target": {"space": "v2", "collection": "c2"}, "job": "j1", "job_status": "running",
        "started_at": "2026-01-01T00:00:00Z", "started_by": "ops",
        "progress": {"stage": "backfill", "done": 300, "total": 1000, "fraction": 0.3,
                     "order": "learned", "switch": "progressive", "transformed": 1000,
                     "switch_at": 0.15, "switched_at_fraction": 0.15,
                     "switched_at": "2026-01-01T00:01:00Z",
                     "transform": {"method": "procrustes", "sample": 500},
                     "curve": [{"fraction": 0.0}, {"fraction": 1.0}],
                     "share_estimate": {"fraction": 0.3,
                                        "t2i": {"side": 0.5, "share": {"share": 0.62,
                                                                       "se": 0.04}},
                                        "i2t": {"side": 0.4, "share": {"share": -0.1,
                                                                       "se": 0.05}}}},
        "gate": None, "result": {}}


def test_status_prints_the_progress_as_a_table_or_json(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    def fake(gateway: str, method: str, path: str, key: str | None = None,
             body: Any = None, timeout: float = 60) -> Any:
        calls.append((gateway, method, path, key))
        return VIEW

    monkeypatch.setattr(migrate_cli, "call", fake)
    code, out, _ = run(capsys, "status", "--gallery", "demo", "--gateway", "http://g:1",
                       "--key", "k")
    assert code == 0 and calls == [("http://g:1", "GET", "/v1/galleries/demo/migration", "k")]
    rows = dict(migrate_cli.status_rows(VIEW))
    assert out.strip() == migrate_cli.table(migrate_cli.status_rows(VIEW))
    assert rows["done"] == "300/1000" and rows["fraction"] == "30.0%"
    assert rows["transformed"] == "1000" and rows["stage"] == "backfill"
    assert "switched at 15.0% (2026-01-01T00:01:00Z)" in out
    assert "t2i 62.0% ± 4.0%, i2t -10.0% ± 5.0% (curve at 30.0%)" in out
    assert "procrustes, sample 500" in out
    code, out, _ = run(capsys, "status", "--gallery", "demo", "--json")
    assert code == 0 and json.loads(out) == VIEW
    planned = {**VIEW, "state": "backfilling",
               "progress": {**VIEW["progress"], "switched_at_fraction": None}}
    assert ("switch", "switches at 15.0%") in migrate_cli.status_rows(planned)
    never = {**planned, "progress": {**planned["progress"], "switch_at": None}}
    never_text = "no progressive switch (the side never beats the route on validation)"
    assert ("switch", never_text) in migrate_cli.status_rows(never)
