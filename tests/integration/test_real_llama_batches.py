"""A batch through the real llama-server router (one model at a time): the OpenAI client's
batch code, and lines for two models that alternate in the file served with one load each,
not a swap a line."""

import json

import openai
import pytest

from scheduler.models import MetricEvent, Priority, Request, State
from tests.integration.conftest import eventually
from tests.integration.test_real_llama_router import CHAT, assert_words, discovered

pytest.importorskip("gguf", reason="needs the integration extra: pip install -e '.[integration]'")

pytestmark = pytest.mark.integration


def test_a_batch_alternating_two_models_loads_each_once(router, switchyard):
    discovered(router, max_llm=1)
    live = switchyard()
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=300)
    models = ["tiny", "large"] * 3
    lines = [
        {
            "custom_id": f"{i}-{model}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": CHAT, "max_tokens": 4},
        }
        for i, model in enumerate(models)
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines).encode()
    source = client.files.create(file=("lines.jsonl", text), purpose="batch")
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # About 10 s here alone; on two busy cores it took over a minute.
    eventually(
        lambda: client.batches.retrieve(batch.id).status == "completed", timeout=240, what="batch"
    )
    done = client.batches.retrieve(batch.id)
    assert (done.request_counts.completed, done.error_file_id) == (6, None), live.log()
    answers = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [a["custom_id"] for a in answers] == [line["custom_id"] for line in lines]
    for a in answers:
        assert a["response"]["body"]["model"] in ("tiny", "large")
        assert_words(a["response"]["body"]["choices"][0]["message"]["content"])
    requests = Request.objects.all()
    assert {(r.priority, r.state) for r in requests} == {(Priority.BACKGROUND, State.COMPLETED)}
    loads = MetricEvent.objects.filter(kind=MetricEvent.Kind.LOAD).values_list("model", flat=True)
    assert sorted(loads) == ["large", "tiny"]  # FIFO, one line at a time: six


@pytest.mark.parametrize("loaded_first", [True, False], ids=["loaded first", "loaded for it"])
def test_a_person_is_answered_while_a_batch_of_another_model_goes_on(
    router, switchyard, loaded_first
):
    """One LLM at a time, `large` busy with a background batch; a person asks for `tiny`.
    `large` takes no more of the batch until it is idle, `tiny` loads, the person is
    answered, and the batch goes on: they do not wait for the whole batch (the free slot
    went to the batch's next line before). Also when the whole batch waited for `large`'s
    load: once that load has served, it was not wasted (no wasted load held it for all 40
    before, and a batch of 300 made a person wait 75 s)."""
    discovered(router, max_llm=1)
    live = switchyard()
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=300)
    if loaded_first:
        client.chat.completions.create(model="large", messages=CHAT, max_tokens=4)
    lines = [
        {
            "custom_id": str(i),
            "method": "POST",
            "url": "/v1/chat/completions",
            # Of unlike lengths, so that the two slots never free at once: with `large`
            # idle for a moment between two lines, `tiny` could load without a drain.
            "body": {"model": "large", "messages": CHAT, "max_tokens": 16 + 29 * (i % 4)},
        }
        for i in range(40)
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines).encode()
    source = client.files.create(file=("lines.jsonl", text), purpose="batch")
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    background = Request.objects.filter(priority=Priority.BACKGROUND)
    eventually(lambda: background.filter(state=State.COMPLETED).exists(), what="the batch going")

    answer = client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=4, extra_body={"priority": "interactive"}
    )

    assert_words(answer.choices[0].message.content)
    assert background.exclude(state=State.COMPLETED).exists(), live.log()  # still going
    # About 10 s here alone; on two busy cores it took over a minute.
    eventually(
        lambda: client.batches.retrieve(batch.id).status == "completed", timeout=240, what="batch"
    )
    loads = MetricEvent.objects.filter(kind=MetricEvent.Kind.LOAD).order_by("at")
    assert list(loads.values_list("model", flat=True)) == ["large", "tiny", "large"]
