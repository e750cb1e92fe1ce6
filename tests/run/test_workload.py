"""The chat workload: seeded, interleaved, histories that grow from the engine's answers."""

from __future__ import annotations

import itertools

import pytest

from kvtier.errors import ConfigError, ProtocolError
from kvtier.run.workload import Chat, WorkloadSpec, generate_workload

SPEC = WorkloadSpec(
    conversations=3, turns=4, system_tokens=20, user_tokens=(5, 9), answer_tokens=(2, 4)
)


def test_same_seed_same_plan_and_other_seed_another() -> None:
    assert generate_workload(SPEC, 100) == generate_workload(SPEC, 100)
    other = WorkloadSpec(
        conversations=3,
        turns=4,
        system_tokens=20,
        user_tokens=(5, 9),
        answer_tokens=(2, 4),
        seed=1,
    )
    assert generate_workload(other, 100) != generate_workload(SPEC, 100)


def test_turns_are_interleaved_round_robin() -> None:
    w = generate_workload(SPEC, 100)
    assert len(w.turns) == 12
    assert [(t.conversation, t.index) for t in w.turns[:4]] == [(0, 0), (1, 0), (2, 0), (0, 1)]
    for i, t in enumerate(w.turns):
        assert (t.conversation, t.index) == (i % 3, i // 3)


def test_lengths_and_token_ids_in_range() -> None:
    w = generate_workload(SPEC, 50)
    assert len(w.system_token_ids) == 20
    for t in w.turns:
        assert 5 <= len(t.user_token_ids) <= 9
        assert 2 <= t.answer_tokens <= 4
        assert all(0 <= x < 50 for x in t.user_token_ids)
    assert all(0 <= x < 50 for x in w.system_token_ids)


def test_histories_grow_by_each_turn_and_its_answer() -> None:
    w = generate_workload(SPEC, 100)
    for conv in range(3):
        turns = [t for t in w.turns if t.conversation == conv]
        assert turns[0].history_tokens == 20
        for prev, cur in itertools.pairwise(turns):
            assert cur.history_tokens == prev.prompt_tokens + prev.answer_tokens
    finals = w.final_history_tokens()
    assert finals == [
        [t for t in w.turns if t.conversation == c][-1].prompt_tokens
        + [t for t in w.turns if t.conversation == c][-1].answer_tokens
        for c in range(3)
    ]
    assert w.distinct_tokens() == 20 + sum(n - 20 for n in finals)
    assert w.max_request_tokens == max(finals)


def test_chat_shares_the_system_prompt_and_feeds_back_the_answers() -> None:
    w = generate_workload(SPEC, 100)
    chat = Chat(w)
    answers = {}
    for t in w.turns:
        prompt = chat.prompt(t)
        assert prompt[:20] == list(w.system_token_ids)
        assert len(prompt) == t.prompt_tokens
        assert prompt[-len(t.user_token_ids) :] == list(t.user_token_ids)
        if t.index > 0:  # the previous turn's message and answer end the history
            prev_user, prev_answer = answers[(t.conversation, t.index - 1)]
            tail = prev_user + prev_answer
            assert prompt[t.history_tokens - len(tail) : t.history_tokens] == tail
        answer = [1000 + t.conversation * 10 + i for i in range(t.answer_tokens)]
        answers[(t.conversation, t.index)] = (list(t.user_token_ids), answer)
        chat.record(t, answer)


def test_chat_refuses_turns_out_of_order_and_wrong_answer_lengths() -> None:
    w = generate_workload(SPEC, 100)
    chat = Chat(w)
    with pytest.raises(ProtocolError, match="out of order"):
        chat.prompt(w.turns[3])  # conversation 0 turn 1 before turn 0
    with pytest.raises(ProtocolError, match="planned"):
        chat.record(w.turns[0], [1] * (w.turns[0].answer_tokens + 1))


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"conversations": 0}, "--conversations"),
        ({"turns": 0}, "--turns"),
        ({"system_tokens": -1}, "--system-tokens"),
        ({"user_tokens": (30, 10)}, "--user-tokens"),
        ({"answer_tokens": (0, 4)}, "--answer-tokens"),
    ],
)
def test_bad_spec_names_the_option(kwargs: dict[str, object], option: str) -> None:
    with pytest.raises(ConfigError) as info:
        WorkloadSpec(**kwargs)  # type: ignore[arg-type]
    assert info.value.key == option
