"""Real client libraries against loops-mock, unmodified: only the printed variables change."""

import json
import os

import pytest

CAPABILITIES = """
    import json, os, {lib}
    r = {lib}.get("https://api.baseten.co/v1/loops/capabilities", headers={{"Authorization": "Bearer " + os.environ["BASETEN_API_KEY"]}})
    print(json.dumps({{"status": r.status_code, "models": [m["model_name"] for m in r.json()["supported_models"]]}}))
"""


@pytest.mark.parametrize("lib", ["requests", "httpx"])
def test_reaches_baseten_control_plane_through_the_proxy(run_client, proxy_env, lib):
    out, _ = run_client(CAPABILITIES.format(lib=lib), proxy_env)
    assert out["status"] == 200
    assert "Qwen/Qwen3.5-2B" in out["models"]


@pytest.mark.parametrize("lib", ["requests", "httpx"])
def test_a_client_that_does_not_trust_the_ca_fails_its_handshake(run_client, proxy_env, lib):
    env = {k: v for k, v in proxy_env.items() if k not in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")}
    code = f"""
        import json, {lib}
        try:
            {lib}.get("https://api.baseten.co/v1/loops/capabilities")
            print(json.dumps({{"error": None}}))
        except Exception as err:
            print(json.dumps({{"error": type(err).__name__, "text": str(err)}}))
    """
    out, _ = run_client(code, env)
    assert out["error"] in ("SSLError", "ConnectError"), out
    assert "CERTIFICATE_VERIFY_FAILED" in out["text"]


def test_a_refused_host_says_why_and_which_flag_allows_it(run_client, proxy_env):
    code = """
        import json, requests
        try:
            requests.get("https://example.com/")
            print(json.dumps({"error": None}))
        except Exception as err:
            print(json.dumps({"error": type(err).__name__, "text": str(err)}))
    """
    out, _ = run_client(code, proxy_env)
    assert out["error"] == "ProxyError"
    assert "403 loops-mock does not proxy example.com" in out["text"]
    assert "--proxy-passthrough example.com" in out["text"]


def test_the_reference_driver_runs_sft_round_against_api_baseten_co(run_client, mock, proxy_env, tmp_path):
    # The driver is the conformance suite's standard-library client; with no LOOPS_BASE_URL it uses https://api.baseten.co.
    output = tmp_path / "output.json"
    env = {**proxy_env, "LOOPS_CONFORMANCE_TASK": "sft-round", "LOOPS_CONFORMANCE_INPUT": mock["sft_input"], "LOOPS_CONFORMANCE_OUTPUT": str(output)}
    code = f"""
        import runpy, sys
        sys.argv = [{mock["driver"]!r}]
        try:
            runpy.run_path({mock["driver"]!r}, run_name="__main__")
        except SystemExit as done:
            sys.exit(done.code)
    """
    run_client(code, env)
    result = json.loads(output.read_text())
    assert result["status"] == "ok", result
    assert result["losses"]["final"] < result["losses"]["baseline"]
    assert result["samples"] and all(s["policy_version"] == result["optim_steps"] for s in result["samples"])


HUB_DOWNLOAD = """
    import hashlib, json
    from huggingface_hub import hf_hub_download
    path = hf_hub_download("Qwen/Qwen3.5-2B", "tokenizer.json")
    print(json.dumps({"sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(), "path": path}))
"""

AUTO_TOKENIZER = """
    import json
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained("Qwen/Qwen3.5-2B")
    prompts = json.load(open(EXPECTED))["prompts"]
    # The DeepSeek V3 family's files too (their class is a Llama tokenizer, which transformers 5 would rebuild).
    ds = AutoTokenizer.from_pretrained("deepseek-ai/DeepSeek-V4-Pro")
    print(json.dumps({"ids": [tok.encode(p, add_special_tokens=False) for p in prompts], "eos": tok.eos_token,
                      "ds_ids": [ds.encode(p, add_special_tokens=False) for p in prompts]}))
"""


@pytest.mark.parametrize("route", ["HF_ENDPOINT", "proxy"])
def test_hf_hub_download_gets_the_mocks_own_tokenizer(run_client, mock, proxy_env, endpoint_env, route):
    out, _ = run_client(HUB_DOWNLOAD, endpoint_env if route == "HF_ENDPOINT" else proxy_env)
    assert out["sha256"] == mock["tokenizer_json_sha256"]
    assert "/snapshots/" in out["path"]


@pytest.mark.parametrize("route", ["HF_ENDPOINT", "proxy"])
def test_auto_tokenizer_encodes_the_support_tickets_as_the_mock_does(run_client, mock, proxy_env, endpoint_env, route):
    out, _ = run_client(AUTO_TOKENIZER.replace("EXPECTED", repr(mock["expected_file"])), endpoint_env if route == "HF_ENDPOINT" else proxy_env)
    assert out["ids"] == mock["ids"]
    assert out["eos"] == "<|im_end|>"
    assert out["ds_ids"] == mock["ds_ids"]


def test_hub_misses_raise_the_hubs_own_errors(run_client, endpoint_env):
    code = """
        import json
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
        seen = {}
        for name, call in [
            ("entry", lambda: hf_hub_download("Qwen/Qwen3.5-2B", "no-such-file.bin")),
            ("repo", lambda: hf_hub_download("nobody/no-such-model", "config.json")),
            ("revision", lambda: hf_hub_download("Qwen/Qwen3.5-2B", "tokenizer.json", revision="v0.0-missing")),
        ]:
            try:
                call()
                seen[name] = None
            except Exception as err:
                seen[name] = [c.__name__ for c in (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError) if isinstance(err, c)] or repr(err)
        print(json.dumps(seen))
    """
    out, _ = run_client(code, endpoint_env)
    assert out == {"entry": ["EntryNotFoundError"], "repo": ["RepositoryNotFoundError"], "revision": ["RevisionNotFoundError"]}


def test_model_info_reports_the_revision_and_files(run_client, endpoint_env):
    code = """
        import json
        from huggingface_hub import HfApi
        info = HfApi().model_info("Qwen/Qwen3.5-2B")
        again = HfApi().model_info("Qwen/Qwen3.5-2B", revision=info.sha)
        print(json.dumps({"sha": info.sha, "again": again.sha, "files": sorted(s.rfilename for s in info.siblings)}))
    """
    out, _ = run_client(code, endpoint_env)
    assert len(out["sha"]) == 40 and out["again"] == out["sha"]
    assert out["files"] == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
