"""Reusable model builders (like torchvision's models): the character LSTM language model
(``charlm``), the GPT-style transformer language model (``transformer_lm``) and the sampling
programs both decode with (``generation``). The ``retrograd`` command (``retrograd.cli``) trains
and samples them; they build on the library only."""
