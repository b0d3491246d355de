"""A tiny model folder laid out exactly like a hub snapshot of Qwen/Qwen3-8B: the real config fields and values except the
sizes, the real generation config, bf16 safetensors weights written by `save_pretrained`, and a byte-level BPE tokenizer
whose special tokens sit at Qwen3's real ids (the base vocabulary is padded to Qwen3's 151643 entries) with Qwen3's own
chat template."""
import json
from pathlib import Path

QWEN3_VOCAB_SIZE = 151936       # rows of Qwen3's embedding table (the tokenizer uses the first 151669)
QWEN3_BASE_VOCAB = 151643       # byte-level BPE entries: ids 0 .. 151642
QWEN3_MASK_TOKEN_ID = 151669    # the shipped configs' mask token: the first embedding row no token uses

# Qwen3's added tokens at their real ids; the first 14 are special (skipped by decode(skip_special_tokens=True)),
# the tool/fim/think tags are not. As in Qwen/Qwen3-8B's tokenizer_config.json `added_tokens_decoder`.
QWEN3_ADDED_TOKENS = {
    151643: ("<|endoftext|>", True), 151644: ("<|im_start|>", True), 151645: ("<|im_end|>", True),
    151646: ("<|object_ref_start|>", True), 151647: ("<|object_ref_end|>", True), 151648: ("<|box_start|>", True),
    151649: ("<|box_end|>", True), 151650: ("<|quad_start|>", True), 151651: ("<|quad_end|>", True),
    151652: ("<|vision_start|>", True), 151653: ("<|vision_end|>", True), 151654: ("<|vision_pad|>", True),
    151655: ("<|image_pad|>", True), 151656: ("<|video_pad|>", True), 151657: ("<tool_call>", False),
    151658: ("</tool_call>", False), 151659: ("<|fim_prefix|>", False), 151660: ("<|fim_middle|>", False),
    151661: ("<|fim_suffix|>", False), 151662: ("<|fim_pad|>", False), 151663: ("<|repo_name|>", False),
    151664: ("<|file_sep|>", False), 151665: ("<tool_response>", False), 151666: ("</tool_response>", False),
    151667: ("<think>", False), 151668: ("</think>", False)}

# Qwen/Qwen3-8B's chat template, verbatim: the "chat_template" string of that model's tokenizer_config.json (test data
# taken from the model's own file, not written here). It pre-fills an empty think block when enable_thinking is false.
QWEN3_CHAT_TEMPLATE = (Path(__file__).parent / "data" / "qwen3_8b_chat_template.jinja").read_text()

# Qwen/Qwen3-8B's config.json, in the layout transformers 5 writes (rope_theta inside rope_parameters, dtype); only the
# sizes are changed for the tiny model (`tiny_sizes`). 8 layers keep the shipped configs' 5 draft layers valid under the
# default layer rule (layers 1..5).
QWEN3_8B_CONFIG = dict(
    architectures=["Qwen3ForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=151643,
    eos_token_id=151645, head_dim=128, hidden_act="silu", hidden_size=4096, initializer_range=0.02,
    intermediate_size=12288, max_position_embeddings=40960, max_window_layers=36, model_type="qwen3",
    num_attention_heads=32, num_hidden_layers=36, num_key_value_heads=8, rms_norm_eps=1e-06,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, sliding_window=None, tie_word_embeddings=False,
    dtype="bfloat16", use_cache=True, use_sliding_window=False, vocab_size=QWEN3_VOCAB_SIZE)
TINY_SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_window_layers=8)
QWEN3_8B_GENERATION_CONFIG = dict(bos_token_id=151643, do_sample=True, eos_token_id=[151645, 151643], pad_token_id=151643,
                                  temperature=0.6, top_k=20, top_p=0.95)

# Qwen2/Qwen3's pre-tokenizer split pattern (tokenizer.json of Qwen/Qwen3-8B).
_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")


def qwen3_tokenizer_json(corpus, bpe_size: int = 600) -> dict:
    """tokenizer.json: a byte-level BPE trained on `corpus`, its vocabulary padded with filler entries (never produced by
    the merges) up to Qwen3's 151643, then Qwen3's added tokens at their real ids. Normaliser, pre-tokenizer, decoder and
    post-processor as in Qwen3's tokenizer.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=bpe_size, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    filler = (f"Ġw{i}" for i in range(10**7))          # decodes to " w<i>": readable when a random model emits one
    while len(vocab) < QWEN3_BASE_VOCAB:
        if (t := next(filler)) not in vocab: vocab[t] = len(vocab)
    spec["added_tokens"] = [dict(id=i, content=c, single_word=False, lstrip=False, rstrip=False, normalized=False, special=s)
                            for i, (c, s) in QWEN3_ADDED_TOKENS.items()]
    return spec


def qwen3_tokenizer_config() -> dict:
    "tokenizer_config.json as Qwen/Qwen3-8B ships it (its chat template, special tokens, Qwen2Tokenizer class)."
    return {"add_bos_token": False, "add_prefix_space": False,
            "added_tokens_decoder": {str(i): dict(content=c, lstrip=False, normalized=False, rstrip=False, single_word=False,
                                                  special=s) for i, (c, s) in QWEN3_ADDED_TOKENS.items()},
            "additional_special_tokens": [c for i, (c, s) in QWEN3_ADDED_TOKENS.items() if s and i != 151643],
            "bos_token": None, "chat_template": QWEN3_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
            "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


def write_qwen3_snapshot(out_dir, corpus, seed: int = 0) -> Path:
    "Write the tiny Qwen3-8B-layout folder (config, generation config, bf16 safetensors, tokenizer) to `out_dir`."
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = Qwen3Config(**{**QWEN3_8B_CONFIG, **TINY_SIZES})
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config = GenerationConfig(**QWEN3_8B_GENERATION_CONFIG)
    model.save_pretrained(out)                        # config.json, generation_config.json, model.safetensors
    (out / "tokenizer.json").write_text(json.dumps(qwen3_tokenizer_json(corpus), ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(qwen3_tokenizer_config(), indent=2, ensure_ascii=False))
    return out
