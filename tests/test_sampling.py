"""The default sampler on plain lists of logits (the torch path applies the same rules to tensors)."""

import math
from collections import Counter

import pytest

from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sampling import sample_rows
from metroline.core.requests.sequence import Sequence

LOGITS = [0.0, 3.0, 1.0, 2.9, -1.0]  # token 1 is the argmax, token 3 close behind


def seq(i: int = 0, **sampling) -> Sequence:
    return Sequence(f"r{i}", [1, 2, 3], SamplingParams(**sampling), 0.0, arrival_no=i)


def test_greedy_takes_the_argmax():
    assert sample_rows([seq(temperature=0.0), seq(1, temperature=0.0)], [LOGITS, [5.0, 0.0]]) == [1, 0]


def test_top_k_1_is_greedy_at_any_temperature():
    assert {sample_rows([seq(temperature=5.0, top_k=1)], [LOGITS])[0] for _ in range(50)} == {1}


def test_top_k_keeps_only_the_k_best():
    seen = Counter(sample_rows([seq(temperature=10.0, top_k=2)], [LOGITS])[0] for _ in range(400))
    assert set(seen) == {1, 3} and min(seen.values()) > 100  # at a high temperature both are likely


def test_top_p_keeps_the_smallest_set_reaching_p():
    # softmax of LOGITS: p(1) = 0.46, p(3) = 0.42, p(2) = 0.06, ...: top_p 0.5 keeps {1, 3}
    probs = [math.exp(x) for x in LOGITS]
    total = sum(probs)
    assert probs[1] / total < 0.5 < (probs[1] + probs[3]) / total
    seen = {sample_rows([seq(top_p=0.5)], [LOGITS])[0] for _ in range(300)}
    assert seen == {1, 3}


def test_a_seeded_request_samples_the_same_tokens_whatever_the_batch():
    alone = [sample_rows([seq(seed=42)], [LOGITS])[0] for _ in range(5)]
    batched = [sample_rows([seq(9, temperature=0.0), seq(seed=42)], [[1.0, 0.0], LOGITS])[1] for _ in range(5)]
    assert alone == batched and len(set(alone)) == 1  # same position, same seed: same token
    positions = set()
    for extra in range(30):  # the seed stream moves with the position
        s = seq(seed=42)
        s.token_ids.extend([7] * extra)
        positions.add(sample_rows([s], [LOGITS])[0])
    assert len(positions) > 1


def test_rows_and_sequences_must_match():
    with pytest.raises(ValueError):
        sample_rows([seq(), seq(1)], [LOGITS])


def test_min_p_and_min_tokens_on_lists():
    # softmax(LOGITS): p(1) = 0.46, p(2) = 0.06; min_p 0.2 cuts below 0.092: only tokens 1 and 3 stay
    probs = [math.exp(x) for x in LOGITS]
    assert probs[2] / sum(probs) < 0.2 * probs[1] / sum(probs) < probs[3] / sum(probs)
    assert {sample_rows([seq(i, min_p=0.2, seed=i)], [LOGITS])[0] for i in range(300)} == {1, 3}
    # EOS (1) is the argmax; before min_tokens it cannot be sampled, nor stop id 3
    banned = seq(temperature=0.0, min_tokens=1, stop_token_ids=(3,))
    assert sample_rows([banned], [LOGITS], eos_token_id=1) == [2]
    assert sample_rows([seq(temperature=0.0, min_tokens=1, ignore_eos=True)], [LOGITS], eos_token_id=1) == [1]
