"""The AnimeGamer model: tokenizer, MLLM, decoder, sampler, VAE and video encoding."""
