"""Generate a tiny Llama model folder on the spot: a tokenizer and a config, no download.

    python bench/sglang_cpu/make_model.py DIR

Runs in SGLang's own virtualenv (it needs `tokenizers` and `transformers`, which the project's
does not). DIR gets:

* a byte-level BPE tokenizer (vocabulary 512) trained in about a second on a fixed English
  corpus, with the special tokens `<s> </s> <pad> <unk> <|im_start|> <|im_end|>` and a ChatML
  chat template, saved by `PreTrainedTokenizerFast.save_pretrained`;
* `config.json` for `LlamaForCausalLM`: hidden size 128, intermediate 256, 2 layers, 4 heads,
  2 KV heads, head_dim 32, context 2048. SGLang runs it with `--load-format dummy` (random
  weights), so no weights file is written.

The same corpus and settings give the same tokenizer every time, so tests may compare ids.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

VOCAB_SIZE = 512
CONTEXT_LENGTH = 2048
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CORPUS = [
    "The auction orders requests by their bids and serves the highest first.",
    "A shared prefix is computed once and cached for every request that follows it.",
    "Each user has a budget; a hold is placed when a request arrives and settled later.",
    "You are a helpful assistant. Answer the question briefly and precisely.",
    "What is the capital of France? Paris is the capital of France.",
    "Tell me a story about a cat, a dog and a small red boat on a quiet lake.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000, and punctuation: ; : , . ! ? ( ) [ ] { }",
    "The quick brown fox jumps over the lazy dog while the engine decodes tokens.",
]


def corpus() -> list[str]:
    """The training texts: the sentences above, repeated so every merge is seen often."""
    return [line for line in _CORPUS for _ in range(20)]


def build(directory: Path) -> None:
    """Write the tokenizer and the config into `directory`."""
    tk = importlib.import_module("tokenizers")
    fast = importlib.import_module("transformers").PreTrainedTokenizerFast

    core = tk.Tokenizer(tk.models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus(), trainer=trainer)
    core.post_processor = tk.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", core.token_to_id("<s>"))]
    )
    tokenizer = fast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=CONTEXT_LENGTH,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))

    vocab = core.get_vocab_size()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": CONTEXT_LENGTH,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": core.token_to_id("<s>"),
        "eos_token_id": core.token_to_id("</s>"),
        "pad_token_id": core.token_to_id("<pad>"),
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
        + "\n"
    )
    # Round trip: what every test relies on.
    text = "The auction serves the highest bid first."
    ids = tokenizer.encode(text, add_special_tokens=False)
    if tokenizer.decode(ids) != text:
        raise SystemExit(f"the tokenizer in {directory} does not round-trip")
    print(f"model: tiny Llama, vocabulary {vocab}, in {directory}")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_model.py DIR")
    build(Path(sys.argv[1]))


if __name__ == "__main__":
    main()
