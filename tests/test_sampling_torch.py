"""The default sampler on logits tensors: each option's effect on hand-built rows, exactly."""

import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from metroline.core.requests.request import SamplingParams  # noqa: E402
from metroline.core.requests.sampling import processed_logits, request_seed  # noqa: E402
from metroline.core.requests.sequence import Sequence  # noqa: E402
from metroline.executors.torch.sampling import TorchSampler as Sampler  # noqa: E402
from metroline.executors.torch.sampling import apply_penalties  # noqa: E402

PROBS = [0.5, 0.3, 0.15, 0.05]
LOG_PROBS = [math.log(p) for p in PROBS]  # softmax(LOG_PROBS) == PROBS


def seq(i: int = 0, prompt=(1, 2, 3), output=(), index: int = 0, **sampling) -> Sequence:
    s = Sequence(f"r{i}", list(prompt), SamplingParams(**sampling), 0.0, arrival_no=i, index=index)
    s.token_ids.extend(output)
    return s


def rows(row, n: int):
    return torch.tensor([row] * n, dtype=torch.float32)


def draws(n: int = 2000, row=LOG_PROBS, **sampling) -> Counter:
    """`n` draws of one row, each by a request with its own seed."""
    seqs = [seq(i, seed=i, **sampling) for i in range(n)]
    return Counter(Sampler().sample(seqs, rows(row, n)))


def test_greedy_is_the_argmax_and_the_first_on_ties():
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 5.0, -1.0], [-3.0, -2.0, -2.5]])
    assert Sampler().sample([seq(i, temperature=0.0) for i in range(3)], logits) == [1, 0, 1]


def test_a_temperature_below_1e_5_is_greedy_even_where_dividing_would_overflow():
    # logits / 1e-300 are +inf for every positive logit: a draw would take the first of them (0),
    # not the argmax (1); below vLLM's 1e-5 the sampler takes the argmax, on tensors and lists alike
    row = [1.0, 3.0, 2.0, -1.0]
    for t in (1e-300, 1e-40, 9e-6, 0.0):
        assert Sampler().sample([seq(i, temperature=t) for i in range(4)], rows(row, 4)) == [1] * 4
        assert Sampler().sample([seq(temperature=t)], [row]) == [1]
    assert SamplingParams(temperature=1e-5).greedy is False


def test_greedy_rows_in_a_batch_with_sampled_rows_stay_the_argmax():
    logits = rows([0.0, 3.0, 1.0, 2.9], 6)
    seqs = [seq(i, temperature=0.0 if i % 2 else 5.0, seed=i) for i in range(6)]
    tokens = Sampler().sample(seqs, logits)
    assert [tokens[i] for i in (1, 3, 5)] == [1, 1, 1]


def test_temperature_draws_follow_the_softmax():
    # at temperature 2 the probabilities are softmax(log(p) / 2), proportional to sqrt(p)
    n = 4000
    seen = draws(n, temperature=2.0)
    roots = [math.sqrt(p) for p in PROBS]
    for token, r in enumerate(roots):
        expected = r / sum(roots)
        sigma = math.sqrt(expected * (1 - expected) / n)
        assert abs(seen[token] / n - expected) < 5 * sigma


def test_top_k_never_samples_outside_the_top_k():
    seen = draws(temperature=10.0, top_k=2)  # at a high temperature the others would be likely
    assert set(seen) == {0, 1} and min(seen.values()) > 600


def test_top_k_1_is_the_argmax_at_any_temperature():
    assert set(draws(300, temperature=50.0, top_k=1)) == {0}


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    # min_p 0.2: threshold 0.2 * 0.5 = 0.1 drops token 3 (0.05) and keeps token 2 (0.15)
    seen = draws(min_p=0.2)
    assert set(seen) == {0, 1, 2}
    # min_p 0.5: threshold 0.25 keeps tokens 0 and 1 only
    assert set(draws(min_p=0.5)) == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # cumulative mass of the most likely tokens: 0.5, 0.8, 0.95, 1.0
    assert set(draws(top_p=0.75)) == {0, 1}
    assert set(draws(top_p=0.9)) == {0, 1, 2}
    assert set(draws(300, top_p=0.4)) == {0}


def test_a_top_p_too_small_for_float32_keeps_the_most_likely_token():
    # 1e-300 > 0 passes validation but is 0.0 in float32: the nucleus is the top token alone,
    # whether it is found among the candidates or by the full sort of a wide vocabulary
    from metroline.executors.torch.sampling import CANDIDATES

    assert set(draws(200, top_p=1e-300)) == {0}
    flat = [-1e-6 * i for i in range(3 * CANDIDATES)]
    assert set(draws(50, row=flat, top_p=1e-300)) == {0}


def test_top_k_then_top_p_renormalises_the_kept_tokens():
    # top_k 2 leaves 0.5 / 0.8 = 0.625 and 0.375: top_p 0.6 then keeps token 0 alone
    assert set(draws(300, top_k=2, top_p=0.6)) == {0}


def test_penalties_change_the_logits_by_the_derived_amounts():
    row = [2.0, -1.0, 3.0, 0.5, 1.0]
    s = seq(prompt=[0, 1], output=[1, 2, 2], repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    expected = [
        2.0 / 2,                    # in the prompt: positive, divided by 2; not in the output
        -1.0 * 2 - 0.5 * 1 - 0.25,  # prompt and output once: negative, times 2; then -0.5 - 0.25
        3.0 / 2 - 0.5 * 2 - 0.25,   # output twice
        0.5,                        # never seen
        1.0,
    ]
    got = apply_penalties(torch.tensor([row]), [s])[0].tolist()
    assert got == pytest.approx(expected, abs=1e-6)
    assert processed_logits(s, row) == pytest.approx(expected, abs=1e-12)  # the list path agrees


def test_penalties_apply_only_to_their_rows():
    row = [1.0, 1.0, 1.0]
    seqs = [seq(0, prompt=[0], output=[0]), seq(1, prompt=[0], output=[0], presence_penalty=2.0)]
    got = apply_penalties(torch.tensor([row]), seqs[1:])[0].tolist()
    assert got == [-1.0, 1.0, 1.0]
    # greedy with a presence penalty avoids the repeated token; without one it takes it (first on ties)
    tokens = Sampler().sample([seq(0, prompt=[0], output=[0], temperature=0.0),
                               seq(1, prompt=[0], output=[0], temperature=0.0, presence_penalty=2.0)], rows(row, 2))
    assert tokens == [0, 1]


def test_repetition_penalty_covers_the_prompt_and_frequency_only_the_output():
    row = [1.0, 1.0, 1.0]
    rep = apply_penalties(torch.tensor([row]), [seq(prompt=[2], repetition_penalty=4.0)])[0].tolist()
    freq = apply_penalties(torch.tensor([row]), [seq(prompt=[2], frequency_penalty=1.0)])[0].tolist()
    assert rep == [1.0, 1.0, 0.25] and freq == row


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    row = [0.0, 5.0, 4.0, 1.0]  # EOS (1) is the argmax, stop id 2 next
    kw = dict(temperature=0.0, min_tokens=2, stop_token_ids=(2,))
    early, done = seq(0, output=[3], **kw), seq(1, output=[3, 3], **kw)
    assert Sampler().sample([early, done], rows(row, 2), eos_token_id=1) == [3, 1]
    # ignore_eos: EOS is an ordinary token, only the stop ids are banned
    assert Sampler().sample([seq(2, ignore_eos=True, **kw)], rows(row, 1), eos_token_id=1) == [1]


def test_the_input_logits_are_not_modified():
    logits = rows([0.0, 3.0, 1.0, 2.9], 3)
    before = logits.clone()
    Sampler().sample([seq(0, temperature=0.7, top_k=2, top_p=0.9, min_p=0.1, repetition_penalty=1.3, seed=1),
                      seq(1, temperature=0.0, min_tokens=2, stop_token_ids=(1,)), seq(2)], logits, eos_token_id=3)
    assert torch.equal(logits, before)


def test_a_seeded_row_draws_the_same_token_alone_and_in_any_batch():
    gen = torch.Generator().manual_seed(7)
    vocab = 50
    target = [torch.randn(vocab, generator=gen) for _ in range(20)]  # 20 positions of one request
    for pos, row in enumerate(target):
        params = dict(temperature=0.9, top_p=0.95, seed=1234)
        alone = Sampler().sample([seq(0, output=[5] * pos, **params)], row[None])[0]
        others = [seq(i, output=[7] * (i % 5), temperature=(i % 3) * 0.5, seed=None if i % 2 else i)
                  for i in range(1, 32)]
        batch = torch.randn(32, vocab, generator=gen)
        slot = pos % 32
        batch[slot] = row
        seqs = others[:slot] + [seq(0, output=[5] * pos, **params)] + others[slot:]
        assert Sampler(seed=pos).sample(seqs, batch)[slot] == alone


def test_each_sample_of_a_request_has_its_own_seed_stream():
    a, b = seq(index=0, seed=5), seq(index=1, seed=5)
    assert request_seed(a) != request_seed(b)
    assert request_seed(a) == request_seed(seq(9, index=0, seed=5))  # not the arrival order
    s = seq(seed=5)
    first = request_seed(s)
    s.token_ids.append(4)
    assert request_seed(s) != first  # the stream moves with the position
    assert request_seed(seq()) is None


def test_unseeded_draws_are_reproducible_from_the_sampler_seed():
    logits = rows([0.0] * 100, 16)
    seqs = [seq(i) for i in range(16)]
    assert Sampler(seed=3).sample(seqs, logits) == Sampler(seed=3).sample(seqs, logits)
    assert Sampler(seed=3).sample(seqs, logits) != Sampler(seed=4).sample(seqs, logits)


def test_a_logits_tensor_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="shape"):
        Sampler().sample([seq(), seq(1)], rows([0.0, 1.0], 3))


def test_cut_offs_per_row_in_a_mixed_batch():
    from metroline.executors.torch.sampling import cut_offs

    x = rows(LOG_PROBS, 4)
    params = [SamplingParams(top_k=2, top_p=0.6), SamplingParams(top_p=0.75), SamplingParams(),
              SamplingParams(min_p=0.5)]
    # row 0: top 2 renormalised 0.625/0.375, top_p 0.6 keeps token 0; row 1: 0.5 + 0.3 reach 0.75;
    # row 2: no filter; row 3: min_p 0.5 keeps p >= 0.25
    expected = [math.log(0.5), math.log(0.3), -math.inf, math.log(0.5) + math.log(0.5)]
    assert cut_offs(x, params).tolist() == pytest.approx(expected, abs=1e-6)


def test_a_nucleus_wider_than_the_candidates_is_sorted_in_full():
    from metroline.executors.torch.sampling import CANDIDATES, cut_offs

    vocab, slope = 3 * CANDIDATES, 1e-4
    r = math.exp(-slope)  # token i has probability r**i / sum: nearly flat, so the nucleus is wide

    def mass(n):  # of the n most likely tokens
        return (1 - r**n) / (1 - r**vocab)

    n = CANDIDATES + 500
    top_p = (mass(n - 1) + mass(n)) / 2  # the nucleus is exactly the n most likely tokens
    x = torch.tensor([[-slope * i for i in range(vocab)]])
    assert cut_offs(x, [SamplingParams(top_p=top_p)]).item() == pytest.approx(-slope * (n - 1), abs=1e-7)
