"""``hf_compat`` picks the keyword each transformers version takes.

Fakes with each version's ``forward`` signature, and the installed transformers's own
Llama: the runner's keywords must never be the deprecated ones (the suite turns a
``FutureWarning`` into an error, which is how transformers 5.24's rename of
``past_key_values`` to ``cache`` was caught).
"""

from __future__ import annotations

import inspect
from typing import Any

from kvtier.engine.hf_compat import cache_keyword, last_logits_kwargs


class NewModel:  # transformers 5.24+
    def forward(self, input_ids: Any = None, cache: Any = None, logits_to_keep: int = 0) -> None:
        pass


class OldModel:  # transformers 4.50 .. 5.23
    def forward(
        self, input_ids: Any = None, past_key_values: Any = None, logits_to_keep: int = 0
    ) -> None:
        pass


class OldestModel:  # transformers 4.45 .. 4.49
    def forward(
        self, input_ids: Any = None, past_key_values: Any = None, num_logits_to_keep: int = 0
    ) -> None:
        pass


def test_the_cache_goes_under_the_keyword_forward_takes() -> None:
    assert cache_keyword(NewModel()) == "cache"  # type: ignore[arg-type]
    assert cache_keyword(OldModel()) == "past_key_values"  # type: ignore[arg-type]


def test_last_logits_keyword_of_each_version() -> None:
    assert last_logits_kwargs(NewModel()) == {"logits_to_keep": 1}  # type: ignore[arg-type]
    assert last_logits_kwargs(OldestModel()) == {"num_logits_to_keep": 1}  # type: ignore[arg-type]


def test_the_installed_llama_takes_the_chosen_keywords(tiny_model: Any) -> None:
    params = inspect.signature(tiny_model.forward).parameters
    chosen = {cache_keyword(tiny_model), *last_logits_kwargs(tiny_model)}
    assert chosen <= set(params)
