"""Models no one here wrote, running as TinyJit-captured graphs: `minilm` (sentence embeddings),
`gpt2` and `llama` (decoders with a KV cache). Import the module you need; each loads lazily."""
