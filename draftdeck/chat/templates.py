# ruff: noqa: E501 - templates hold long literal lines
"""Chat templates DraftDeck ships for tests, demos and benchmarks.

None of them is a model's official template. ``QWEN35_STYLE`` reproduces the behaviours of Qwen3.5's
template that matter for loss masks (see DOMAIN.md):

- it raises on a conversation with no user message and on a system message that is not first;
- it strips the reasoning of assistant turns before the last user query (so rendering is not
  prefix-stable on multi-turn conversations with reasoning);
- turns after the last user query always carry a ``<think>`` block, empty when there is no reasoning;
- tool calls are rendered as ``<tool_call>`` JSON, tool results as ``<tool_response>`` in a user turn;
- ``enable_thinking=False`` pre-fills an empty think block in the generation prompt.
"""

from __future__ import annotations

QWEN35_STYLE = r"""
{%- set ns = namespace(has_user=false, last_query=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set ns.has_user = true -%}{%- endif -%}
{%- endfor -%}
{%- if not ns.has_user -%}{{ raise_exception('No user query found in messages.') }}{%- endif -%}
{%- for m in messages -%}
  {%- if m.role == 'user' and not (m.content is string and m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}
    {%- set ns.last_query = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- if tools -%}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}

{{ tool | tojson }}
{%- endfor %}

</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
  {%- if m.role == 'system' -%}
    {%- if not loop.first -%}{{ raise_exception('System message must be at the beginning.') }}{%- endif -%}
  {%- elif m.role == 'user' -%}
<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' -%}
    {%- set content = m.content if m.content is string else '' -%}
    {%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
    {%- if not reasoning and '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if loop.index0 > ns.last_query -%}
<|im_start|>assistant
<think>
{{ reasoning.strip('\n') }}
</think>

{{ content.lstrip('\n') }}
    {%- else -%}
<|im_start|>assistant
{{ content.lstrip('\n') }}
    {%- endif -%}
    {%- if m.tool_calls -%}
      {%- for tc in m.tool_calls -%}
        {%- set f = tc.function if tc.function is defined else tc -%}
        {%- if loop.first and not content -%}{%- else %}

{% endif -%}
<tool_call>
{"name": "{{ f.name }}", "arguments": {% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}}
</tool_call>
      {%- endfor -%}
    {%- endif -%}
<|im_end|>
{% elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
<|im_start|>user
    {%- endif %}

<tool_response>
{{ m.content }}
</tool_response>
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
<|im_end|>
{% endif -%}
  {%- else -%}
    {{ raise_exception('Unexpected message role: ' + m.role) }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif -%}
{%- endif -%}
""".lstrip("\n")

# A plain ChatML template (prefix-stable, never raises): reasoning is inlined in a think block.
CHATML_SIMPLE = r"""
{%- for m in messages -%}
<|im_start|>{{ m.role }}
{% if m.role == 'assistant' and m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content if m.content is string else '' }}
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls %}

<tool_call>
{{ {"name": tc.function.name, "arguments": tc.function.arguments} | tojson }}
</tool_call>
{%- endfor -%}
{%- endif -%}
<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
""".lstrip("\n")

# The same ChatML layout with HF `{% generation %}` tags around what the assistant generates
# (content, reasoning, tool calls and the end-of-turn token, not the header or the newline after it).
CHATML_GENERATION_TAGS = r"""
{%- for m in messages -%}
<|im_start|>{{ m.role }}
{% if m.role == 'assistant' -%}
{% generation -%}
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content if m.content is string else '' }}
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls %}

<tool_call>
{{ {"name": tc.function.name, "arguments": tc.function.arguments} | tojson }}
</tool_call>
{%- endfor -%}
{%- endif -%}
<|im_end|>
{%- endgeneration %}

{% else -%}
{{ m.content if m.content is string else '' }}<|im_end|>
{% endif -%}
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
""".lstrip("\n")
