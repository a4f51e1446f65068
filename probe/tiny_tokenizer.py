"""The tokenizer and chat template of the tiny test models (:mod:`probe.tiny`), and how a prompt is rendered.

One byte-level BPE tokenizer, trained locally on the synthetic corpus
(:mod:`probe.tiny_corpus`), is shared by every tiny model: Qwen2/3's
pre-tokenizer (every digit its own token), Qwen3's special tokens and a
Qwen3-style chat template with ``enable_thinking``, so engine code written for
Qwen3 runs unchanged on it. :func:`render_prompt` is the chat rendering the
training loop (:mod:`probe.tiny_train`) and its contract use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probe import tiny_corpus

if TYPE_CHECKING:  # transformers is imported lazily
    from transformers import PreTrainedTokenizerBase

#: Seed of the training corpus (and of the tokenizer's training text).
CORPUS_SEED = 20240611

# Qwen2/Qwen3's pre-tokenizer regex. Note ``\p{N}`` without ``+``: every digit
# is its own pre-token, so "10" and "100" are 2 and 3 tokens. That is what
# makes reading a number's probability from a single answer slot subtle, and
# the engine must be tested against it.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
THINK_TOKENS: tuple[str, str] = ("<think>", "</think>")
TOKENIZER_VOCAB = 1280
MAX_POSITIONS = 2048

# Qwen3's template without tool calling: same turn layout, same handling of
# reasoning in history (dropped before the last user query) and the same
# empty think block appended when ``enable_thinking`` is explicitly false.
CHAT_TEMPLATE = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(searching=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.searching and message.role == 'user' %}
        {%- set ns.searching = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


# --------------------------------------------------------------------------- tokenizer


def _tokenizer_training_text() -> list[str]:
    """Plain text (no special tokens) the BPE merges are learned from."""
    texts = list(tiny_corpus.GENERIC_SENTENCES) * 4
    for sample in tiny_corpus.make_samples(3000, CORPUS_SEED):
        texts += ["system\nuser\nassistant\n", sample.user, sample.answer, *([sample.system] if sample.system else [])]
        if sample.think:
            texts.append(sample.think)
    return texts


def build_tokenizer() -> PreTrainedTokenizerBase:
    """Train the shared byte-level BPE tokenizer and wrap it for ``transformers``.

    Byte-level with the full 256-symbol initial alphabet so that any Unicode
    string encodes (no unknown token), Qwen2's split regex so digits are
    single tokens, and ``<think>``/``</think>`` as added single tokens so the
    engine can find the end of a reasoning block by one id, as with Qwen3.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        show_progress=False,
        special_tokens=[PAD_TOKEN, IM_START, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_tokenizer_training_text(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, user: str, *, enable_thinking: bool, system: str | None = None
) -> str:
    """The chat-rendered prompt up to (and including) the assistant header (after a system turn if given)."""
    messages = [{"role": "user", "content": user}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return str(
        tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )
    )
