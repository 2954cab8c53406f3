"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

The file builds section 3 up from its parts, each under a heading that names its section: positions (3.5),
embeddings (3.4), scaled dot-product and multi-head attention (3.2), the position-wise feed-forward network (3.3) and
the encoder and decoder layers (3.1); then transformers' pretrained-model plumbing (weight initialisation, loading),
which the stacks subclass and so must come first; then the encoder and decoder stacks (3.1), the bare model and the
model with its pre-softmax projection (3.4).
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import is_flash_attention_requested, merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .decoding_vanilla_transformer import PAPER_DECODING
from .generation_vanilla_transformer import VanillaTransformerGenerationMixin


# --- 3.5 Positional encoding -------------------------------------------------------------------------------------


def sinusoidal_position_encoding(num_positions: int, d_model: int) -> torch.Tensor:
    """Section 3.5: the (num_positions, d_model) table of sines (even dimensions) and cosines (odd dimensions)."""
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    inverse_wavelength = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angle = position * inverse_wavelength  # (num_positions, ceil(d_model / 2))
    table = torch.empty(num_positions, d_model, dtype=torch.float64)
    # PE(pos, 2i) = sin(pos / 10000^(2i / d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Section 3.5: fixed positions for inputs of any length. The first `cached_positions` rows are kept as a
    non-persistent buffer (never stored in a checkpoint) and indexed with tensor positions, so that a decoding step
    never reads its position back to the host; `num_positions` beyond them get a table computed for that length."""

    def __init__(self, d_model: int, cached_positions: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_position_encoding(cached_positions, d_model), persistent=False)

    def forward(self, position_ids: torch.Tensor, num_positions: int) -> torch.Tensor:
        table = self.table
        if num_positions > table.shape[0]:
            table = sinusoidal_position_encoding(num_positions, self.d_model).to(table)
        return table[position_ids]  # (seq_len, d_model)


class LearnedPositionalEmbedding(nn.Embedding):
    """Table 3 row (E): learned positions instead of sinusoids, up to `max_position_embeddings`."""

    def forward(self, position_ids: torch.Tensor, num_positions: int) -> torch.Tensor:
        if num_positions > self.num_embeddings:
            raise ValueError(
                f"Sequence of {num_positions} positions is longer than max_position_embeddings={self.num_embeddings} "
                "of the learned position table; use position_embedding_type='sinusoidal' for inputs of any length."
            )
        return super().forward(position_ids)  # (seq_len, d_model)


def build_positional_encoding(config: VanillaTransformerConfig) -> nn.Module:
    if config.position_embedding_type == "learned":
        return LearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
    return SinusoidalPositionalEncoding(config.d_model)


# --- 3.4 Embeddings ----------------------------------------------------------------------------------------------


def embed_with_positions(
    stack: nn.Module, input_ids, inputs_embeds, name: str, past_len=0, num_positions=None
) -> torch.Tensor:
    """Section 3.4-3.5 and 5.4: Dropout(Embedding(x) * sqrt(d_model) + PE), shared by the encoder and the decoder.
    `inputs_embeds`, when given, is the embedding lookup itself (`model.get_input_embeddings()(ids)`). The tokens
    follow `past_len` cached ones (a 0-dim tensor for a static cache); `num_positions`, a Python int, bounds their
    positions (default: `past_len + seq_len`)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"Pass exactly one of `{name}` and its `inputs_embeds`.")
    if inputs_embeds is None:
        inputs_embeds = stack.embed_tokens(input_ids)
    seq_len = inputs_embeds.shape[1]
    position_ids = torch.arange(seq_len, device=inputs_embeds.device) + past_len
    num_positions = past_len + seq_len if num_positions is None else num_positions
    positions = stack.embed_positions(position_ids, num_positions).to(inputs_embeds.dtype)
    hidden_states = inputs_embeds * stack.embed_scale + positions
    return nn.functional.dropout(hidden_states, p=stack.dropout, training=stack.training)


# --- 3.2.1 Scaled dot-product attention --------------------------------------------------------------------------


def scaled_dot_product_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Section 3.2.1, the "eager" attention implementation. The mask is additive: 0 where attending is allowed and
    the dtype's most negative value where it is not (the paper's -inf, finite so that an all-padding row stays
    finite instead of turning into NaN)."""
    # Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (batch, heads, q_len, k_len)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (batch, q_len, heads, d_v)
    return output, weights


# --- 3.2.2 Multi-head attention ----------------------------------------------------------------------------------


class VanillaTransformerAttention(nn.Module):
    """Section 3.2.2: h heads of scaled dot-product attention on learned projections to queries and keys of d_k and
    values of d_v dimensions (d_model / h unless the config sets them, as Table 3 row (B) does), used as encoder
    self-attention, masked decoder self-attention, and encoder-decoder attention (section 3.2.3). The kernel comes
    from transformers' attention interface (`config._attn_implementation`: eager, sdpa, flash, ...)."""

    def __init__(self, config: VanillaTransformerConfig, num_heads: int, is_causal: bool, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.d_k, self.d_v = config.head_sizes(num_heads)
        self.scaling = self.d_k**-0.5
        self.dropout = config.attention_dropout
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        # W^Q, W^K: d_model x h d_k; W^V: d_model x h d_v; W^O: h d_v x d_model (the h heads' matrices side by side)
        self.q_proj = nn.Linear(config.d_model, num_heads * self.d_k, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.d_model, num_heads * self.d_k, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.d_model, num_heads * self.d_v, bias=config.attention_bias)
        self.out_proj = nn.Linear(num_heads * self.d_v, config.d_model, bias=config.attention_bias)
        # Initialisation (`_init_weights`): query, key and value projections Xavier-uniform with gain 1/sqrt(2), so
        # that the attention logits start at half the variance (fairseq's).
        for projection in (self.q_proj, self.k_proj, self.v_proj):
            projection.xavier_gain = 2**-0.5

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_cross_attention = key_value_states is not None
        batch_size, q_len, _ = hidden_states.shape
        # head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
        query = self.q_proj(hidden_states).view(batch_size, q_len, -1, self.d_k)
        query = query.transpose(1, 2)  # (batch, heads, q_len, d_k)

        layer_cache = None
        if isinstance(cache, EncoderDecoderCache):
            layer_cache = cache.cross_attention_cache if is_cross_attention else cache.self_attention_cache
        elif cache is not None and not is_cross_attention:
            layer_cache = cache

        if is_cross_attention and layer_cache is not None and cache.is_updated.get(self.layer_idx):
            # The encoder output does not change while decoding: its keys and values were projected once.
            key = layer_cache.layers[self.layer_idx].keys
            value = layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross_attention else hidden_states
            heads_shape = (batch_size, source.shape[1], -1)
            key = self.k_proj(source).view(*heads_shape, self.d_k).transpose(1, 2)  # (batch, heads, k_len, d_k)
            value = self.v_proj(source).view(*heads_shape, self.d_v).transpose(1, 2)  # (batch, heads, k_len, d_v)
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if is_cross_attention:
                    cache.is_updated[self.layer_idx] = True

        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, scaled_dot_product_attention
        )
        output, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        # MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
        output = self.out_proj(output.reshape(batch_size, q_len, -1))  # (batch, q_len, heads * d_v) -> d_model
        return output, weights


# --- 3.3 Position-wise feed-forward network and 3.1 residual connections, shared by both kinds of layer -----------


class VanillaTransformerLayer(GradientCheckpointingLayer):
    """What encoder and decoder layers share: the feed-forward network of section 3.3 and the residual connection
    of section 3.1 around every sub-layer."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.config = config
        self.dropout = config.dropout
        self.normalize_before = config.normalize_before
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        # Initialisation (`_init_weights`): W1, b1, W2, b2 as nn.Linear initialises them (fairseq's), about half the
        # Xavier scale, so that each residual sum starts closer to its input.
        self.fc1.default_torch_init = self.fc2.default_torch_init = True
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # FFN(x) = max(0, x W1 + b1) W2 + b2
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)

    def residual(self, x: torch.Tensor, layer_norm: nn.LayerNorm, sublayer: Callable) -> torch.Tensor:
        """Sections 3.1 and 5.4. Post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
        Pre-norm (`config.normalize_before`, as tensor2tensor): x + Dropout(Sublayer(LayerNorm(x)))."""
        if self.normalize_before:
            return x + nn.functional.dropout(sublayer(layer_norm(x)), p=self.dropout, training=self.training)
        return layer_norm(x + nn.functional.dropout(sublayer(x), p=self.dropout, training=self.training))


# --- 3.1 Encoder and decoder layers ------------------------------------------------------------------------------


class VanillaTransformerEncoderLayer(VanillaTransformerLayer):
    """Section 3.1: multi-head self-attention, then the feed-forward network, each inside a residual connection
    (post-norm as in the paper unless `config.normalize_before`)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None):
        super().__init__(config, config.encoder_ffn_dim)
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads, is_causal=False)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        def self_attention(x):
            return self.self_attn(x, attention_mask=attention_mask, **kwargs)[0]

        hidden_states = self.residual(hidden_states, self.self_attn_layer_norm, self_attention)
        return self.residual(hidden_states, self.final_layer_norm, self.feed_forward)


class VanillaTransformerDecoderLayer(VanillaTransformerLayer):
    """Section 3.1: masked multi-head self-attention, multi-head attention over the encoder output, then the
    feed-forward network, each inside a residual connection."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None):
        super().__init__(config, config.decoder_ffn_dim)
        heads = config.decoder_attention_heads
        self.self_attn = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.encoder_attn = VanillaTransformerAttention(config, heads, is_causal=False, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        def masked_self_attention(x):
            return self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)[0]

        def encoder_decoder_attention(x):
            return self.encoder_attn(x, encoder_hidden_states, encoder_attention_mask, cache=cache, **kwargs)[0]

        hidden_states = self.residual(hidden_states, self.self_attn_layer_norm, masked_self_attention)
        hidden_states = self.residual(hidden_states, self.encoder_attn_layer_norm, encoder_decoder_attention)
        return self.residual(hidden_states, self.final_layer_norm, self.feed_forward)


# --- Pretrained-model plumbing -----------------------------------------------------------------------------------


def _says_safetensors_weights_are_missing(error: OSError) -> bool:
    """Whether transformers refused to load a model because it found no safetensors weights: it says so only in words,
    and this is the one place that reads them (tests/test_hub.py checks them against the pinned release)."""
    return "safetensors" in str(error)


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    config: VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True  # cached decoding steps: tests/test_compile.py

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, use_safetensors: bool | None = True, **kwargs):
        """transformers' `from_pretrained`, but weights load from safetensors only: a pickle checkpoint
        (`pytorch_model.bin`) can run arbitrary code when unpickled, so it needs an explicit `use_safetensors=False`."""
        try:
            return super().from_pretrained(
                pretrained_model_name_or_path, *model_args, use_safetensors=use_safetensors, **kwargs
            )
        except OSError as error:
            if use_safetensors is not True or not _says_safetensors_weights_are_missing(error):
                raise
            raise OSError(
                f"{pretrained_model_name_or_path} has no safetensors weights (model.safetensors). vanilla-transformer "
                "refuses pickle checkpoints such as pytorch_model.bin by default, because unpickling can run arbitrary "
                "code. If you trust the source, pass use_safetensors=False to load it, then save_pretrained() it to "
                "get safetensors."
            ) from error

    def _check_and_adjust_attn_implementation(self, attn_implementation, *args, **kwargs) -> str:
        # transformers' flash kernels pad each head's values up to the query size, never queries up to the value size:
        # a model with d_k < d_v (Table 3 row (B)) is refused here, as the kernel is chosen, not deep in a forward.
        implementation = super()._check_and_adjust_attn_implementation(attn_implementation, *args, **kwargs)
        for heads in (self.config.encoder_attention_heads, self.config.decoder_attention_heads):
            d_k, d_v = self.config.head_sizes(heads)
            if d_k < d_v and is_flash_attention_requested(requested_attention_implementation=implementation):
                raise ValueError(
                    f"attn_implementation={implementation!r} cannot run queries and keys smaller than values (d_k="
                    f"{d_k}, d_v={d_v}): transformers' flash attention needs d_v <= d_k. Use 'sdpa' or 'eager'."
                )
        return implementation

    @torch.no_grad()
    def _init_weights(self, module):
        # The paper gives no initialisation; this is fairseq's for this post-norm model, with which ours learns update
        # for update as fairseq's does (docs/experiments/fairseq.md). Embeddings N(0, d_model^-0.5): times
        # sqrt(d_model) (section 3.4) they have unit variance like the positional encodings, and as the tied
        # pre-softmax projection they give logits of unit scale from the unit-variance LayerNorm output. Projections
        # Xavier-uniform with zero biases; the query, key and value projections with the smaller gain their attention
        # gives them (`xavier_gain`); the feed-forward layers as nn.Linear initialises them.
        if isinstance(module, nn.Linear) and getattr(module, "default_torch_init", False):
            # Weights and biases uniform in +-1/sqrt(fan_in) (Kaiming-uniform with a = sqrt(5) for the weights).
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            init.uniform_(module.bias, -module.in_features**-0.5, module.in_features**-0.5)
        elif isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight, gain=getattr(module, "xavier_gain", 1.0))
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = self.config.init_std if self.config.init_std is not None else self.config.d_model**-0.5
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, SinusoidalPositionalEncoding):
            init.copy_(module.table, sinusoidal_position_encoding(*module.table.shape))


# --- The encoder and decoder stacks ------------------------------------------------------------------------------


class VanillaTransformerEncoder(VanillaTransformerPreTrainedModel):
    """Section 3.1: the encoder, N identical layers over the scaled source embeddings plus positions."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.dropout = config.dropout
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = build_positional_encoding(config)
        self.layers = nn.ModuleList(VanillaTransformerEncoderLayer(config) for _ in range(config.encoder_layers))
        # Pre-norm leaves the last layer's output un-normalised; post-norm (the paper) has no final LayerNorm.
        self.layer_norm = nn.LayerNorm(config.d_model) if config.normalize_before else None
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        hidden_states = embed_with_positions(self, input_ids, inputs_embeds, name="input_ids")
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(VanillaTransformerPreTrainedModel):
    """Section 3.1: the decoder, N identical layers over the scaled, right-shifted target embeddings plus positions,
    attending to the encoder output. Decoding step by step appends self-attention keys and values to the cache and
    projects the encoder output to keys and values once."""

    _can_record_outputs = {
        "hidden_states": OutputRecorder(VanillaTransformerDecoderLayer, num_hidden_layers_key="decoder_layers"),
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.dropout = config.dropout
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = build_positional_encoding(config)
        self.layers = nn.ModuleList(
            VanillaTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(config.d_model) if config.normalize_before else None
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # transformers >= 5.24 calls it cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        # A static cache counts its tokens in a tensor, so that a compiled step needs no host read and no new graph per
        # position: its capacity, a Python int, then bounds the positions.
        past_len = cache.get_seq_length() if cache is not None else 0
        num_positions = None if isinstance(past_len, int) else cache.get_max_length()
        hidden_states = embed_with_positions(
            self, input_ids, inputs_embeds, "decoder_input_ids", past_len, num_positions
        )

        self_attention_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        # Position i attends to positions <= i only (section 3.2.3), and never to padding.
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            cache=self_attention_cache,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, so gradient checkpointing passes it through
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)


# --- The model and its pre-softmax projection --------------------------------------------------------------------


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs are the outputs "shifted right by one position" (section 3.1): start token, then labels[:-1]."""
    decoder_input_ids = labels.new_empty(labels.shape)
    decoder_input_ids[:, 1:] = labels[:, :-1]
    decoder_input_ids[:, 0] = decoder_start_token_id
    # Labels ignored by the loss (-100) are padding to the decoder.
    return decoder_input_ids.masked_fill_(decoder_input_ids == -100, pad_token_id)


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """The encoder-decoder of section 3.1 with one embedding matrix shared by source and target (section 3.4): the
    stacks' embedding weights are tied to `shared` by transformers' weight tying, as BART's are."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding):
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # transformers >= 5.24 calls it cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)

        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, VanillaTransformerGenerationMixin):
    """The Transformer with its pre-softmax linear transformation, which shares the embedding matrix (section 3.4),
    for translation with `generate()`. `labels` give the cross-entropy loss (positions labelled -100 are ignored)."""

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # Section 6.1 decoding is the default of every model (a saved generation_config.json replaces it on load).
        for name, value in PAPER_DECODING.items():
            setattr(self.generation_config, name, value)
        self.generation_config._from_model_config = False  # else loading would drop the two settings not transformers'

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear):
        self.lm_head = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # transformers >= 5.24 calls it cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs: Seq2SeqModelOutput = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (batch, tgt_len, vocab)

        loss = None
        if labels is not None:
            # Token-level cross-entropy, no shift (decoder inputs are already shifted); honours the Trainer's
            # num_items_in_batch so gradient accumulation averages over all tokens.
            loss = ForMaskedLMLoss(logits, labels, self.config.vocab_size, **kwargs)

        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
]
