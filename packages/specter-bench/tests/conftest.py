"""Settings shared by specter-bench's tests."""

import matplotlib
import pytest
import torch

import specter_models

# Tiny models and tensors: intra-op threads only add synchronisation on a small shared machine.
torch.set_num_threads(1)
# Plots are built without pyplot; this keeps any indirect pyplot import headless too.
matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _private_specter_cache(tmp_path, monkeypatch):
    """Each test keeps what generate measures (its depth costs) in a folder of its own, so
    no test reads another's, or the user's, stored costs."""
    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "specter-cache"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny DeepSeek-V2 checkpoint folder with a tokenizer, as save_pretrained writes it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("ckpt")
    model = specter_models.build_reference_model("tiny-deepseek-v2", seed=4, device="cpu")
    model.float().save_pretrained(folder)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["def add(a, b): return a + b", "for i in range(10): print(i)"] * 20
    trainer = trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(folder)
    return folder
