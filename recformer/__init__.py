"""recformer: a tokenized-feature Transformer ranker that scales, and the instrument that shows why.

Shape suffixes. Tensors in model and data code carry their shape in their name (``x_BTD``), one
letter per axis, with the same meaning in every file:

=====  ==========================================================================================
``B``  batch rows
``T``  tokens per sample (CLS, context, history events, target)
``D``  model width
``N``  attention heads
``H``  head width (D / N)
``Q``  query tokens a block updates (T, or the R the head reads, in the last block)
``R``  tokens the head reads (1 or 2)
``M``  hidden width of an MLP (a block's, the head's)
``X``  an MLP's up-projection width (M, or 2M for SwiGLU)
``Y``  blocks (``n_layers``)
``V``  rows of an embedding table
``L``  history length: events per sample (``max_len``)
``S``  item slots per sample (L history events and the target: L + 1)
``F``  context categorical fields
``C``  per-event categorical fields
``I``  item side features
``J``  ids of one item token (1 + I)
``U``  id bags per sample (F + S)
``Z``  ids of a whole batch, flattened
``E``  summed width of the per-row embedding columns
``P``  width of the item content embedding
``Dn`` dense features
``K``  key columns (copied to predictions)
``G``  values of the bag fields (their ``max_values`` summed)
``O``  id fields whose unknown ids are counted
``W``  widths (of a coordinate check)
``A``  optimizer steps (of a coordinate check)
=====  ==========================================================================================
"""

__version__ = "0.1.0"
