"""The session fixture's server and its admin client, used directly (one server for this module)."""

from __future__ import annotations

import urllib.error
import uuid

import pytest

from loops_mock import (
    LoopsMock,
    MockAdmin,
    MockAdminBadRequest,
    MockAdminConflict,
    MockAdminError,
    MockAdminNotFound,
    MockAdminUnauthorized,
)
from lm_support import request

MODEL = "Qwen/Qwen3.5-2B"


@pytest.fixture(autouse=True)
def fresh(loops_mock: LoopsMock):
    """Each test starts from a reset server and leaves one behind."""
    loops_mock.admin.reset()
    yield
    loops_mock.admin.reset()


def new_run(api):
    status, body = api("POST", "/v1/loops/sessions")
    assert status == 200, body
    session_id = body["session"]["id"]
    status, body = api("POST", "/v1/loops/runs", {"session_id": session_id, "base_model": MODEL, "lora_rank": 4, "seed": 1})
    assert status == 200, body
    run = body["run"]
    trainer = run["base_url"]
    sampler_id = run["sampler"]["base_url"].split("://", 1)[1].split("/")[2]
    return session_id, run, trainer, sampler_id


def test_env_holds_the_printed_variables_and_the_api_key_works(loops_mock: LoopsMock):
    env = loops_mock.env
    assert set(env) == {"LOOPS_BASE_URL", "BASETEN_API_KEY", "BASETEN_MANAGEMENT_API_URL_OVERRIDE", "HF_ENDPOINT"}
    assert loops_mock.url.startswith("http://127.0.0.1:") and loops_mock.port > 0
    assert env["LOOPS_BASE_URL"] == loops_mock.url
    assert env["BASETEN_MANAGEMENT_API_URL_OVERRIDE"] == loops_mock.url
    assert env["HF_ENDPOINT"] == loops_mock.url + "/hf"
    assert loops_mock.api_key and env["BASETEN_API_KEY"] == loops_mock.api_key
    assert loops_mock.running and loops_mock.process.poll() is None
    status, body = request(f"{loops_mock.url}/v1/loops/capabilities", headers={"authorization": f"Bearer {loops_mock.api_key}"})
    assert status == 200, body
    assert request(f"{loops_mock.url}/v1/loops/capabilities")[0] == 401


def test_the_admin_api_needs_the_random_token_the_plugin_gave(loops_mock: LoopsMock):
    assert loops_mock.admin_token and f"--admin-token={loops_mock.admin_token}" in loops_mock.command
    assert loops_mock.admin_token not in repr(loops_mock)
    with pytest.raises(MockAdminUnauthorized) as caught:
        MockAdmin(loops_mock.url, "wrong-token").faults()
    assert caught.value.status == 401 and caught.value.type == "unauthorized"
    assert "--admin-token" in caught.value.message


def test_journal_shows_a_request(loops_mock: LoopsMock, api):
    before = loops_mock.admin.journal()
    key = f"journal-{uuid.uuid4()}"
    assert api("GET", "/v1/loops/capabilities", headers={"idempotency-key": key})[0] == 200
    page = loops_mock.admin.journal(surface="control", since=before["next_since"])
    assert set(page) == {"entries", "next_since", "evicted"}
    [entry] = [e for e in page["entries"] if e["path"] == "/v1/loops/capabilities"]
    assert entry["method"] == "GET" and entry["status"] == 200 and entry["surface"] == "control"
    assert entry["headers"] == {"auth": "bearer", "idempotency_key": key}
    assert page["next_since"] >= entry["seq"] > before["next_since"]
    assert all(e["surface"] == "control" for e in page["entries"])
    assert loops_mock.admin.journal(surface="control", since=page["next_since"])["entries"] == []
    assert len(loops_mock.admin.journal(limit=1)["entries"]) == 1


def test_a_fault_rule_gives_the_injected_status_then_is_spent_and_removed(loops_mock: LoopsMock, api):
    admin = loops_mock.admin
    rule = admin.add_fault({"match": {"route": "/v1/loops/capabilities"}, "action": {"type": "respond", "status": 503, "retry_after_s": 2}, "times": 1})
    assert rule["id"] and rule["remaining"] == 1
    status, body = api("GET", "/v1/loops/capabilities")
    assert status == 503 and body["error"]["fault_id"] == rule["id"]
    assert api("GET", "/v1/loops/capabilities")[0] == 200
    [listed] = admin.faults()
    assert listed["id"] == rule["id"] and listed["fired"] == 1 and listed["remaining"] == 0
    assert admin.delete_fault(rule["id"])["id"] == rule["id"]
    assert admin.faults() == []
    with pytest.raises(MockAdminNotFound) as caught:
        admin.delete_fault(rule["id"])
    assert caught.value.status == 404 and caught.value.type == "not_found"
    admin.add_fault({"match": {"op": "optim_step"}, "action": {"type": "drop", "phase": "after"}})
    admin.add_fault({"match": {"op": "sample"}, "action": {"type": "respond", "status": 429}})
    assert admin.clear_faults() == {"removed": 2}
    assert admin.faults() == []


def test_a_bad_rule_raises_a_typed_error_with_the_servers_type_and_message(loops_mock: LoopsMock):
    with pytest.raises(MockAdminError) as caught:
        loops_mock.admin.add_fault({"match": {}, "action": {"type": "explode"}})
    err = caught.value
    assert isinstance(err, MockAdminBadRequest) and not isinstance(err, urllib.error.HTTPError)
    assert err.status == 400 and err.type == "invalid_request"
    assert "action.type must be one of" in err.message and "explode" in err.message
    assert err.body["error"]["field"] == "body.action.type" and err.error["field"] == "body.action.type"
    assert "POST /_mock/faults answered 400" in str(err)
    assert loops_mock.admin.faults() == []


def test_reset_forgets_records_rules_and_settings(loops_mock: LoopsMock, api):
    admin = loops_mock.admin
    status, body = api("POST", "/v1/loops/sessions")
    session_id = body["session"]["id"]
    assert api("GET", f"/v1/loops/sessions/{session_id}")[0] == 200
    admin.add_fault({"match": {"op": "sample"}, "action": {"type": "respond", "status": 429}})
    admin.patch_settings(floor_wait_ms=123)
    assert admin.reset() == {"reset": True}
    assert api("GET", f"/v1/loops/sessions/{session_id}")[0] == 404
    assert admin.faults() == []
    assert admin.settings()["floor_wait_ms"] == 2000
    assert all(e["path"] != "/v1/loops/sessions" for e in admin.journal()["entries"])


def test_settings_read_and_patch(loops_mock: LoopsMock):
    admin = loops_mock.admin
    assert admin.settings()["floor_wait_ms"] == 2000
    changed = admin.patch_settings(floor_wait_ms=300, weight_sync_delay_ms=[10, 20])
    assert changed["floor_wait_ms"] == 300 and changed["weight_sync_delay_ms"] == [10, 20]
    assert admin.patch_settings({"long_poll_ms": 1000})["long_poll_ms"] == 1000
    assert admin.settings()["floor_wait_ms"] == 300
    with pytest.raises(MockAdminBadRequest) as caught:
        admin.patch_settings(long_poll_ms=60_000)
    assert caught.value.type == "invalid_request" and "long_poll_ms" in caught.value.message


def test_a_real_clock_refuses_to_advance(loops_mock: LoopsMock):
    clock = loops_mock.admin.clock()
    assert clock["mode"] == "real" and clock["now_ms"] > 0 and clock["now"].endswith("Z")
    with pytest.raises(MockAdminConflict) as caught:
        loops_mock.admin.advance(1000)
    assert caught.value.status == 409 and caught.value.type == "conflict" and "--clock virtual" in caught.value.message


def test_scenarios_list_and_apply(loops_mock: LoopsMock):
    admin = loops_mock.admin
    names = admin.scenarios()
    assert "lagging-replica" in names and "flaky-network" in names
    applied = admin.apply_scenario("lagging-replica")
    assert applied["name"] == "lagging-replica"
    assert admin.settings()["sampler_replicas"] == 2
    applied = admin.apply_scenario(scenario={"name": "mine", "settings": {"floor_wait_ms": 50}, "faults": [{"match": {"op": "sample"}, "action": {"type": "respond", "status": 429}}]})
    assert applied == {"name": "mine", "faults": 1, "progress": 0}
    assert admin.settings()["floor_wait_ms"] == 50 and admin.settings()["sampler_replicas"] == 1
    applied = admin.apply_scenario(text="name: yaml-one\nsettings:\n  floor_wait_ms: 70\n")
    assert applied["name"] == "yaml-one" and admin.settings()["floor_wait_ms"] == 70 and admin.faults() == []
    with pytest.raises(MockAdminBadRequest) as caught:
        admin.apply_scenario(text="name: bad\nsettings:\n  no_such_setting: 1\n")
    assert "no_such_setting" in caught.value.message
    with pytest.raises(TypeError):
        admin.apply_scenario()
    with pytest.raises(TypeError):
        admin.apply_scenario("lagging-replica", text="name: x\n")


def test_progress_rules_hold_an_operation_until_released(loops_mock: LoopsMock, api):
    admin = loops_mock.admin
    rule = admin.add_progress({"match": {"op": "forward_backward"}, "mode": "manual", "times": 1})
    assert [r["id"] for r in admin.progress_rules()] == [rule["id"]]
    _, _, trainer, _ = new_run(api)
    datum = {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3, 4]}]}, "loss_fn_inputs": {"target_tokens": {"data": [2, 3, 4, 5], "dtype": "int64", "shape": [4]}}}
    status, body = api("POST", f"{trainer}/forward_backward", {"data": [datum], "loss_fn": "cross_entropy"}, {"idempotency-key": "fb-1"})
    assert status == 200, body
    op_id = body["operation_id"]
    [held] = admin.held_operations()
    assert held["operation_id"] == op_id and held["op"] == "forward_backward" and held["mode"] == "manual"
    assert admin.release(op_id)["operation_id"] == op_id
    with pytest.raises(MockAdminConflict):
        admin.release(op_id)
    status, body = api("GET", f"{trainer}/operations/{op_id}")
    assert status == 200 and body["status"] == "done", body
    assert admin.held_operations() == []
    assert admin.delete_progress(rule["id"])["id"] == rule["id"]
    admin.add_progress({"mode": "after_polls", "polls": 2})
    assert admin.clear_progress() == {"removed": 1} and admin.progress_rules() == []


def test_sampler_replicas_are_controlled(loops_mock: LoopsMock, api):
    admin = loops_mock.admin
    _, _, _, sampler_id = new_run(api)
    state = admin.sampler(sampler_id)
    assert state["sampler_id"] == sampler_id and len(state["replicas"]) == 1
    assert len(admin.set_replicas(sampler_id, 3)["replicas"]) == 3
    replica = admin.control_replica(sampler_id, 1, sync_delay_ms=500, paused=True)
    assert replica["sync_delay_ms"] == 500 and replica["paused"] is True
    replica = admin.control_replica(sampler_id, 1, paused=False)
    assert replica["sync_delay_ms"] == 500 and replica["paused"] is False
    replica = admin.control_replica(sampler_id, 1, sync_delay_ms=None)
    assert replica["sync_delay_ms"] == 0  # the settings' weight_sync_delay_ms again
    with pytest.raises(MockAdminNotFound) as caught:
        admin.sampler("no-such-sampler")
    assert "no-such-sampler" in caught.value.message
