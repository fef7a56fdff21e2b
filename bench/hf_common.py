"""What the HF baselines (hf_train.py, hf_lora_train.py) share: their command line, the
LLaMA-3.1-8B shape, the token windows ftd-worker trains on, and one step's record."""
import numpy as np
import torch


def add_run_args(ap, lr):
    """--tokens, --batch, --seq, --steps and --lr (default `lr`)."""
    ap.add_argument("--tokens", required=True, help="uint32 token file")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, default=lr)


def llama_8b_config():
    """The LLaMA-3.1-8B shape (ftd's llama-3.1-8b preset)."""
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                       rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=False,
                       rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=8192))


def token_windows(path, seq):
    """The file's tokens as rows of seq + 1 (inputs and shifted targets), in file order."""
    w = seq + 1
    tokens = np.fromfile(path, dtype="<u4")
    return torch.from_numpy(tokens[: (len(tokens) // w) * w].astype(np.int64)).view(-1, w)


def step_record(step, loss, dt, batch, seq):
    """One step's line in the output: loss, time, throughput and the peak GPU memory since the reset."""
    return {"step": step, "loss": loss, "step_time_s": dt, "tokens_per_s": batch * seq / dt,
            "peak_mem_allocated_bytes": torch.cuda.max_memory_allocated(),
            "peak_mem_reserved_bytes": torch.cuda.max_memory_reserved()}
