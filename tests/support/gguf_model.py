"""A GGUF file written here, the way llama.cpp's converter writes one, so that the GGUF import is
tested without a download: a tiny Llama with SmolLM2-135M-Instruct's shape (ChatML, its special
tokens first, ``<|im_end|>`` as EOS and pad, its chat template with the default system prompt), its
weights partly quantized to Q8_0 as a published GGUF's are (``gguf``'s own quantizer).

:func:`write_smollm2_gguf` returns the original model too, so a test can compare what the import
dequantized with the weights that went in."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.model_families import _corpus_texts

# SmolLM2-135M-Instruct's chat template, as its GGUF carries it (tokenizer.chat_template)
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
ROPE_THETA = 100000.0  # SmolLM2's
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2


def _tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(_corpus_texts()) + ["system\n", "user\n", "assistant\n"] * 50, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                      pad_token="<|im_end|>", unk_token="<|endoftext|>")
    wrapped.chat_template = SMOLLM2_CHAT_TEMPLATE
    return wrapped


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of the rotary halves in attn_q/attn_k (transformers undoes it on load)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_smollm2_gguf(path: str | Path, vocab_size: int = 400, seed: int = 0,
                       quantize: bool = True) -> tuple[Any, Any]:
    """Write a tiny SmolLM2-shaped model as one GGUF file at ``path``; return the (model, tokenizer)
    it was made from. ``quantize``: the 2-D weights as Q8_0 (the norms stay F32), as published
    files mix them."""
    import gguf
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer(vocab_size)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=ROPE_THETA, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("SmolLM2 tiny (test)")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(len(tokenizer))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantize else gguf.LlamaFileType.ALL_F32)

    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = set(SPECIALS)
    merges = [" ".join(m) if isinstance(m, (list, tuple)) else m
              for m in __import__("json").loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(SMOLLM2_CHAT_TEMPLATE)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight":  # tied to the embeddings: a GGUF stores them once
            continue
        stem, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(stem) + "." + suffix
        data = tensor.detach().float().numpy()
        if name.endswith(("attn_q.weight",)):
            data = _permute(data, config.num_attention_heads)
        elif name.endswith(("attn_k.weight",)):
            data = _permute(data, config.num_key_value_heads)
        if quantize and data.ndim == 2:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer
