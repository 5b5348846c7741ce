"""A request and its samples: what is submitted (`Request`, `SamplingParams`), a sample's live
state and state machine (`Sequence`), and what a sample's tokens become (sampling rules, log-
probabilities, incremental text).

- `request.py`: `Request`, `SamplingParams`, the limits checked at submission;
- `sequence.py`: `Sequence` (one sample of a request), `SeqState`, `FinishReason`;
- `sampling.py`: the sampling rules and `Sampler` on rows of floats (the torch executor brings the
  tensor one, `executors/torch/sampling.py`);
- `logprobs.py`: the log-probabilities of the sampled tokens;
- `detokenizer.py`: incremental text and stop strings.
"""
