import pytest

import hotswitch.model.attention as attention
from tests.python.model import attention_workers as aw


@pytest.fixture
def stand_ins(monkeypatch):
    """flash_attn, PyTorch's varlen_attn and FlexAttention replaced by dense stand-ins with
    their contracts (``attention_workers``), so that what this package builds for them
    (bounds, masks, padding, keywords) is checked on the CPU; the real kernels are checked by
    the ``gpu`` tests."""
    create_block_mask, flex_attention = aw.flex_stand_ins(attention.FLEX_BLOCK)
    monkeypatch.setattr(attention, "_import_flash", lambda: aw.flash_varlen_stand_in)
    if aw.TORCH_VARLEN is not None:  # PyTorch >= 2.10
        monkeypatch.setattr(aw.TORCH_VARLEN, "varlen_attn", aw.torch_varlen_stand_in)
    monkeypatch.setattr(attention, "_compiled_flex", lambda: (create_block_mask, flex_attention))
    attention._import_varlen.cache_clear()
    yield
    attention._import_varlen.cache_clear()
