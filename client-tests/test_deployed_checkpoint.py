"""A checkpoint deployed to inference, called by the real `openai` client and checked against `transformers`.

server/test/unmodified-clients.test.ts trains a run on two support tickets on each server, deploys its
sampler checkpoint `step-1`, and writes the Loops sampler's greedy answer to each ticket's chat prompt
into the servers file (`deployed_direct`, `deployed_proxy`). The proxy server's deploy answers Baseten's
URL (`https://model-<model_id>.api.baseten.co/deployment/<deployment_id>/sync/v1`), reached through
HTTPS_PROXY and the CA bundle alone.
"""

import json

import pytest

CHAT = """
    import json, os, openai
    spec = json.loads(os.environ["DEPLOYED"])
    client = openai.OpenAI(base_url=spec["base_url"], api_key=os.environ["BASETEN_API_KEY"])
    out = {"plain": [], "streamed": [], "finish": [], "usage": []}
    for case in spec["cases"]:
        r = client.chat.completions.create(model=spec["model"], messages=case["messages"], max_tokens=spec["max_tokens"], temperature=0)
        out["plain"].append(r.choices[0].message.content)
        out["finish"].append(r.choices[0].finish_reason)
        out["usage"].append(r.usage.completion_tokens)
        text, usage = "", None
        for chunk in client.chat.completions.create(model=spec["model"], messages=case["messages"], max_tokens=spec["max_tokens"], temperature=0,
                                                    stream=True, stream_options={"include_usage": True}):
            for choice in chunk.choices:
                text += choice.delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
        out["streamed"].append(text)
        assert usage == r.usage.completion_tokens, (usage, r.usage)
    out["models"] = [m.id for m in client.models.list().data]
    try:
        client.chat.completions.create(model="no-such-checkpoint", messages=spec["cases"][0]["messages"], max_tokens=1)
        out["unknown"] = None
    except openai.NotFoundError as e:
        out["unknown"] = e.status_code
    print(json.dumps(out))
"""


@pytest.mark.parametrize("route", ["direct", "proxy"])
def test_openai_client_gets_the_adapters_greedy_answer(run_client, mock, route):
    spec = mock[f"deployed_{route}"]
    if route == "proxy":
        assert spec["base_url"] == f"https://model-{spec['model_id']}.api.baseten.co/deployment/{spec['deployment_id']}/sync/v1"
        env = {**mock["proxy_env"]}
    else:
        env = {"BASETEN_API_KEY": mock["direct_env"]["BASETEN_API_KEY"]}
    out, _ = run_client(CHAT, {**env, "DEPLOYED": json.dumps(spec)})
    expected = [c["expected"] for c in spec["cases"]]
    assert out["plain"] == expected
    assert out["streamed"] == expected
    assert all(f in ("stop", "length") for f in out["finish"])
    assert out["models"][0] == "step-1"
    assert out["unknown"] == 404


TEMPLATE = """
    import json, os
    from transformers import AutoTokenizer
    cases = json.loads(open(os.environ["CASES"]).read())
    out = []
    for case in cases:
        tok = AutoTokenizer.from_pretrained(case["model"])
        ids = tok.apply_chat_template(case["messages"], tools=case["tools"], add_generation_prompt=True, tokenize=True, return_dict=False, **case["kwargs"])
        if isinstance(ids, dict):
            ids = ids["input_ids"]
        out.append({"model": case["model"], "tools": case["tools"] is not None, "kwargs": case["kwargs"], "equal": list(ids) == case["ids"], "n": len(ids)})
    print(json.dumps({"cases": out}))
"""


def test_chat_template_renders_the_ids_transformers_renders(run_client, mock, endpoint_env, tmp_path):
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(mock["chat_template_cases"]))
    out, _ = run_client(TEMPLATE, {**endpoint_env, "CASES": str(cases_file)})
    families = {c["model"] for c in out["cases"]}
    assert len(families) == 2
    assert len(out["cases"]) == 12
    assert [c for c in out["cases"] if not c["equal"]] == []
