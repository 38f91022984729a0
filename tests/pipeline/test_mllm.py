from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from game.contract import HistoryTurn
from game.state import StateDeltas
from worker.pipeline.config import PipelineConfig, tiny
from worker.pipeline.mllm import AnimeGamerMLLM, frame_attention_mask, parse_states
from worker.pipeline.prompt import Prompt, build_prompt
from worker.pipeline.tokenizer import AnimeGamerTokenizer

NOW = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
EARLIER = "Character: Qiqi; Motion: slowly walk; Background: day forest."
FORCED_AFTER = [["</ML>", "<SC>"], ["</SC>", "<ET>"], ["</ET>", "<ST>"]]


@pytest.fixture
def config() -> PipelineConfig:
    return tiny()


@pytest.fixture
def tokenizer() -> AnimeGamerTokenizer:
    return AnimeGamerTokenizer.tiny()


@pytest.fixture
def model(config: PipelineConfig, tokenizer: AnimeGamerTokenizer) -> AnimeGamerMLLM:
    torch.manual_seed(0)
    return AnimeGamerMLLM(config.mllm, tokenizer.vocab_size, config.decoder.hidden_size, config.num_query_tokens).eval()


@pytest.fixture
def prompt(tokenizer: AnimeGamerTokenizer) -> Prompt:
    return build_prompt(tokenizer, NOW, [])


@pytest.fixture
def embeds(model: AnimeGamerMLLM, prompt: Prompt) -> torch.Tensor:
    return model.embed_prompt(prompt, [])


def past_turn(instruction: str) -> HistoryTurn:
    deltas = StateDeltas(motion=1, social=0, entertainment=-1, stamina=2)
    return HistoryTurn(instruction=instruction, representation=b"", deltas=deltas)


def script(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, successor: dict[str, str], others: float = 0.0
) -> AnimeGamerMLLM:
    """Turn the model into a bigram table: each named token is followed by its successor.

    With the attention and MLP outputs zeroed the residual stream is the token's own embedding;
    one-hot embeddings and a matching lm_head then make greedy decoding follow ``successor``.
    A negative `others` puts every token's score below zero except the successor's (through one
    more embedding channel that every token has and every lm_head row reads with that weight).
    """
    llm = model.llm
    with torch.no_grad():
        for layer in llm.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        llm.model.embed_tokens.weight.zero_()
        llm.lm_head.weight.zero_()
        for k, (name, following) in enumerate(successor.items()):
            llm.model.embed_tokens.weight[tokenizer.token_id(name), k] = 1.0
            llm.lm_head.weight[tokenizer.token_id(following), k] = 10.0
        if others:
            llm.model.embed_tokens.weight[:, -1] = 1.0
            llm.lm_head.weight[:, -1] = others
    return model


WELL_FORMED = {
    "<ML>": "<Strength_2>", "<Strength_2>": "</ML>", "</ML>": "<SC>",
    "<SC>": "<Strength_-3>", "<Strength_-3>": "</SC>", "</SC>": "<ET>",
    "<ET>": "<Strength_5>", "<Strength_5>": "</ET>", "</ET>": "<ST>",
    "<ST>": "<Strength_-1>", "<Strength_-1>": "</ST>", "</ST>": "</s>",
}  # fmt: skip
WELL_FORMED_DELTAS = StateDeltas(motion=2, social=-3, entertainment=5, stamina=-1)


def slow_state_logits(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, embeds: torch.Tensor
) -> tuple[list[int], torch.Tensor]:
    """Reference: no cache, the whole sequence re-run after each single appended token."""
    strength_ids = torch.tensor(tokenizer.strength_ids)
    table = model.llm.get_input_embeddings()
    sequence = embeds
    values, rows = [], []
    with torch.no_grad():
        for slot in range(4):
            row = model.llm(inputs_embeds=sequence, use_cache=False).logits[0, -1, strength_ids]
            rows.append(row)
            values.append(int(row.argmax()) - 5)
            if slot == 3:
                break
            for token in [tokenizer.strength_id(values[-1]), *map(tokenizer.token_id, FORCED_AFTER[slot])]:
                sequence = torch.cat([sequence, table(torch.tensor([[token]]))], dim=1)
    return values, torch.stack(rows)


def manual_hidden_states(model: AnimeGamerMLLM, embeds: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Reference Mistral forward in plain torch, attention restricted by a boolean [T, T] mask."""
    cfg, llm = model.config, model.llm.model
    x = embeds[0]  # [T, C]
    seq_len, head_dim = x.shape[0], cfg.hidden_size // cfg.num_heads
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.arange(seq_len).float()[:, None] * inv_freq[None]  # [T, hd/2]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # [T, hd]

    def rms(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    def rope(v: torch.Tensor) -> torch.Tensor:  # [H, T, hd]
        half = head_dim // 2
        return v * cos + torch.cat([-v[..., half:], v[..., :half]], -1) * sin

    for layer in llm.layers:
        attn, h = layer.self_attn, rms(x, layer.input_layernorm.weight)
        q = rope((h @ attn.q_proj.weight.T).view(seq_len, cfg.num_heads, head_dim).transpose(0, 1))
        k = rope((h @ attn.k_proj.weight.T).view(seq_len, cfg.num_kv_heads, head_dim).transpose(0, 1))
        v = (h @ attn.v_proj.weight.T).view(seq_len, cfg.num_kv_heads, head_dim).transpose(0, 1)
        group = cfg.num_heads // cfg.num_kv_heads
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # [H, T, hd]
        scores = (q @ k.transpose(1, 2) / math.sqrt(head_dim)).masked_fill(~allowed, float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(seq_len, -1)  # [T, C]
        x = x + out @ attn.o_proj.weight.T
        h = rms(x, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        x = x + (F.silu(h @ mlp.gate_proj.weight.T) * (h @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    return rms(x, llm.norm.weight)[None]  # [1, T, C]


# --- construction ---


def test_llm_is_an_untied_sdpa_mistral_of_the_configured_sizes(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, config: PipelineConfig
) -> None:
    llm_config = model.llm.config
    assert llm_config.vocab_size == tokenizer.vocab_size
    assert (llm_config.hidden_size, llm_config.num_hidden_layers) == (config.mllm.hidden_size, config.mllm.num_layers)
    assert (llm_config.num_attention_heads, llm_config.num_key_value_heads) == (4, 2)
    assert llm_config._attn_implementation == "sdpa"
    assert model.llm.lm_head.weight.data_ptr() != model.llm.get_input_embeddings().weight.data_ptr()


def test_resamplers_map_between_representation_and_hidden_widths(model: AnimeGamerMLLM, config: PipelineConfig) -> None:
    width, hidden = config.decoder.hidden_size, config.mllm.hidden_size
    assert model.input_resampler(torch.zeros(3, width)).shape == (3, hidden)
    assert model.output_resampler(torch.zeros(3, hidden)).shape == (3, width)


# --- embed_prompt ---


def test_embed_prompt_without_history_is_the_token_embeddings(
    model: AnimeGamerMLLM, prompt: Prompt, embeds: torch.Tensor
) -> None:
    expected = model.llm.get_input_embeddings()(torch.tensor([prompt.ids]))
    assert embeds.shape == (1, len(prompt.ids), 64)
    torch.testing.assert_close(embeds, expected)


def test_embed_prompt_puts_resampled_representations_in_past_frame_spans(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer
) -> None:
    prompt = build_prompt(tokenizer, NOW, [past_turn(EARLIER)])
    representation = torch.randn(226, 32)
    embeds = model.embed_prompt(prompt, [representation])
    plain = model.llm.get_input_embeddings()(torch.tensor([prompt.ids])).detach()
    (start, end), _ = prompt.frame_spans
    torch.testing.assert_close(embeds[0, start:end], model.input_resampler(representation).detach())
    torch.testing.assert_close(embeds[0, :start], plain[0, :start])
    torch.testing.assert_close(embeds[0, end:], plain[0, end:])  # the current turn's frame tokens stay tokens


def test_embed_prompt_refuses_a_representation_count_unlike_the_history(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer
) -> None:
    prompt = build_prompt(tokenizer, NOW, [past_turn(EARLIER)])
    with pytest.raises(ValueError, match="1 past turns but 0"):
        model.embed_prompt(prompt, [])


def test_embed_prompt_refuses_a_wrongly_shaped_representation(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer
) -> None:
    prompt = build_prompt(tokenizer, NOW, [past_turn(EARLIER)])
    with pytest.raises(ValueError, match=r"shape \(226, 16\)"):
        model.embed_prompt(prompt, [torch.zeros(226, 16)])


# --- state pass ---


def test_state_pass_makes_exactly_four_forward_passes(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, embeds: torch.Tensor
) -> None:
    deltas, passes = model.predict_states(embeds, tokenizer)
    assert passes == 4
    assert isinstance(deltas, StateDeltas)


def test_state_pass_equals_a_token_by_token_reference_without_cache(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer
) -> None:
    prompt = build_prompt(tokenizer, NOW, [past_turn(EARLIER)])
    embeds = model.embed_prompt(prompt, [torch.randn(226, 32)])
    deltas, _ = model.predict_states(embeds, tokenizer)
    logits, _ = model.state_logits(embeds, tokenizer)
    values, reference = slow_state_logits(model, tokenizer, embeds)
    assert [deltas.motion, deltas.social, deltas.entertainment, deltas.stamina] == values
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-5)


def test_state_pass_reads_states_in_ml_sc_et_st_order(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, prompt: Prompt
) -> None:
    script(model, tokenizer, WELL_FORMED)
    deltas, _ = model.predict_states(model.embed_prompt(prompt, []), tokenizer)
    assert deltas == WELL_FORMED_DELTAS


def test_state_pass_yields_states_even_when_the_model_wants_to_stop(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, prompt: Prompt
) -> None:
    script(model, tokenizer, {"<ML>": "</s>"})
    deltas, passes = model.predict_states(model.embed_prompt(prompt, []), tokenizer)
    assert passes == 4
    assert all(-5 <= v <= 5 for v in deltas.model_dump().values())


def test_release_pass_parses_states_and_stops_at_eos(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, prompt: Prompt
) -> None:
    script(model, tokenizer, WELL_FORMED)
    deltas, passes = model.release_state_pass(model.embed_prompt(prompt, []), tokenizer)
    assert deltas == WELL_FORMED_DELTAS
    assert passes == 12  # <Strength_2> .. </ST> </s>, one forward each


def test_release_pass_stops_after_max_new_tokens_and_falls_back_to_zeros(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, prompt: Prompt
) -> None:
    script(model, tokenizer, {"<ML>": "<Strength_4>", "<Strength_4>": "<Strength_4>"})
    deltas, passes = model.release_state_pass(model.embed_prompt(prompt, []), tokenizer, max_new_tokens=7)
    assert passes == 7
    assert deltas == StateDeltas(motion=0, social=0, entertainment=0, stamina=0)


def frames(first: int, stop: int) -> list[str]:
    return [f"<frame_{i:05d}>" for i in range(first, stop)]


@pytest.mark.parametrize("wanted", ["<frame_00007>", "<frame_00099>", "</frame>"])
def test_release_pass_scores_the_first_100_frame_tokens_and_the_closing_tag_zero_not_minus_infinity(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, prompt: Prompt, wanted: str
) -> None:
    # The raw argmax after <ML> is `wanted`; the processor sets it (with <frame_00000>..<frame_00099> and
    # </frame>) to 0.0 while everything else scores below zero, so the lowest of those ids wins: <frame_00000>.
    script(model, tokenizer, {"<ML>": wanted}, others=-1.0)
    ids = model.release_generate(model.embed_prompt(prompt, []), tokenizer, max_new_tokens=3)
    assert [tokenizer.token_name(i) for i in ids] == frames(0, 3)


def test_release_pass_forces_a_frame_run_through_frame_00099_and_closes_it(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, prompt: Prompt
) -> None:
    # The model wants to stop inside the run and to leave it early; both are overridden until </frame>.
    successor = {"<ML>": "<frame>", "<frame>": "</s>", "<frame_00042>": "</s>", "<frame_00099>": "<SC>"}
    script(model, tokenizer, {**successor, "</frame>": "</s>"}, others=-1.0)
    embeds = model.embed_prompt(prompt, [])
    ids = model.release_generate(embeds, tokenizer)
    assert [tokenizer.token_name(i) for i in ids] == ["<frame>", *frames(0, 100), "</frame>", "</s>"]
    assert model.release_state_pass(embeds, tokenizer)[1] == 103  # one forward per generated id


def test_release_pass_leaves_frame_tokens_from_100_on_alone(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer, prompt: Prompt
) -> None:
    script(model, tokenizer, {"<ML>": "<frame_00100>", "<frame_00100>": "<frame_00225>"}, others=-1.0)
    ids = model.release_generate(model.embed_prompt(prompt, []), tokenizer, max_new_tokens=2)
    assert [tokenizer.token_name(i) for i in ids] == ["<frame_00100>", "<frame_00225>"]


def test_parse_states_reads_the_strength_after_each_tag_by_id(tokenizer: AnimeGamerTokenizer) -> None:
    t, s = tokenizer.token_id, tokenizer.strength_id
    ids = [t("<ML>"), s(1), t("</ML>"), t("<SC>"), s(-2), t("<ET>"), s(0), t("<ST>"), s(5), t("</s>")]
    assert parse_states(ids, tokenizer) == StateDeltas(motion=1, social=-2, entertainment=0, stamina=5)


def test_parse_states_is_none_when_a_tag_lacks_its_strength(tokenizer: AnimeGamerTokenizer) -> None:
    t, s = tokenizer.token_id, tokenizer.strength_id
    assert parse_states([t("<ML>"), s(1), t("<SC>"), s(2), t("<ET>"), s(3), t("<ST>"), t("</ST>")], tokenizer) is None
    assert parse_states([t("<ML>"), s(1), t("<SC>"), s(2), t("<ET>"), s(3)], tokenizer) is None


# --- representation pass ---


def test_frame_attention_mask_is_causal_plus_bidirectional_spans() -> None:
    mask = frame_attention_mask(8, [(1, 3), (5, 7)], torch.float32)
    allowed = mask[0, 0] == 0
    expected = torch.ones(8, 8, dtype=torch.bool).tril()
    expected[1, 2] = expected[5, 6] = True
    assert mask.shape == (1, 1, 8, 8)
    assert torch.equal(allowed, expected)


def test_representation_has_query_rows_of_representation_width(
    model: AnimeGamerMLLM, prompt: Prompt, embeds: torch.Tensor
) -> None:
    assert model.predict_representation(embeds, prompt).shape == (1, 226, 32)


def test_representation_frame_tokens_see_later_frame_tokens(
    model: AnimeGamerMLLM, prompt: Prompt, embeds: torch.Tensor
) -> None:
    _, end = prompt.current_frame_span
    changed = embeds.clone()
    changed[0, end - 1] += 1.0  # <frame_00225>
    before, after = model.predict_representation(embeds, prompt), model.predict_representation(changed, prompt)
    assert not torch.allclose(before[0, 0], after[0, 0])  # row 0 is <frame_00003>


def test_representation_stays_causal_after_the_frame_span(
    model: AnimeGamerMLLM, prompt: Prompt, embeds: torch.Tensor
) -> None:
    changed = embeds.clone()
    changed[0, -2] += 1.0  # </img>
    before, after = model.predict_representation(embeds, prompt), model.predict_representation(changed, prompt)
    torch.testing.assert_close(before[0, :-2], after[0, :-2], atol=0, rtol=0)
    assert not torch.allclose(before[0, -2:], after[0, -2:])


def test_representation_reads_frame_00003_to_ml_like_a_manual_forward(
    model: AnimeGamerMLLM, tokenizer: AnimeGamerTokenizer
) -> None:
    prompt = build_prompt(tokenizer, NOW, [past_turn(EARLIER)])
    embeds = model.embed_prompt(prompt, [torch.randn(226, 32)])
    allowed = torch.ones(len(prompt.ids), len(prompt.ids), dtype=torch.bool).tril()
    for start, end in prompt.frame_spans:
        allowed[start:end, start:end] = True
    with torch.no_grad():
        hidden = manual_hidden_states(model, embeds, allowed)  # [1, T, C]
        first = prompt.ids.index(tokenizer.frame_id(3), prompt.current_frame_span[0])
        expected = model.output_resampler(hidden[:, first:])
    assert expected.shape[1] == 226
    torch.testing.assert_close(model.predict_representation(embeds, prompt), expected, atol=1e-5, rtol=1e-4)


def test_the_full_size_mllm_has_mistral_7b_with_the_animegamer_vocabulary():
    from worker.pipeline.config import full

    cfg = full()
    with torch.device("meta"):
        mllm = AnimeGamerMLLM(cfg.mllm, cfg.mllm.base_vocab_size + 284, cfg.decoder.hidden_size)
    llm = sum(p.numel() for p in mllm.llm.parameters())
    resamplers = sum(p.numel() for p in mllm.parameters()) - llm
    assert 7.240e9 < llm < 7.248e9  # Mistral-7B (7.24 B) with 32,284 embedding and head rows
    assert resamplers == (1920 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 1920 + 1920) + (1920 * 1920 + 1920)
