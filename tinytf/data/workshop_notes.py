"""The ``workshop_notes`` corpus: plain English written for this workbook (public domain / MIT with tinytf)."""

TEXT = """\
Notes from a small workshop on attention.

A sequence of tokens goes in, and a sequence of vectors comes out. Each token asks a question with its
query, each token offers an answer with its key, and each token carries a message in its value. The
query of one token is compared with the key of every other token. The scores are divided by the square
root of the width, the softmax turns the scores into weights, and the weights mix the values. That is
all attention does: it reads a weighted average of the values, and the weights say where to look.

The shapes tell the story. The queries are batch by time by width, and so are the keys. The product of
the queries with the transposed keys is batch by time by time: one row for every query, one column for
every key. The softmax runs along the last axis, over the keys, so every row of weights sums to one.
When you are not sure, print the shapes. When you are sure, print them again.

A decoder must not read the future. The causal mask blocks every key that comes after the query, and it
does so before the softmax, so the blocked weights are exactly zero and the other weights still sum to
one. The mask keeps the diagonal: a token may always read itself. If the mask is off by one, the model
learns to copy the next token, the training loss falls very fast, and generation fails. A loss that
falls too fast is a warning, not a prize.

Padding is another mask. Short sentences are padded to the length of the longest one, and the padded
keys are blocked so that no real token reads them. In the loss, padded targets are ignored, and the
mean is taken over the real tokens only. Count the real tokens, and divide by that count.

Many heads look in many places. The width is split into heads, each head runs its own attention on its
own slice, and the heads are joined again. With the same width, more heads do not add parameters; they
split the same projections into more, narrower pieces. One head may follow the previous token, another
may look for the start of the line, a third may look for a matching bracket.

The block has two halves. Attention moves information between positions; the feed forward network
transforms each position on its own. Around each half runs a residual path, and before each half sits
a layer norm. The residual path lets the signal and the gradient pass through many blocks without
fading. The layer norm keeps the scale of each vector under control. Put the norm first, and deep
stacks train with less care; put it last, as in the first paper, and warm up the learning rate slowly.

Training a small model is a loop. Take a batch of windows from the text, run the model, compare each
position with the next character, and follow the gradient downhill. The optimizer keeps two running
averages for every parameter, so its state is twice the size of the model. The learning rate rises
during a short warm up and then falls along a cosine curve. Clip the gradient norm, log the loss, and
save a checkpoint now and then. A checkpoint holds the weights, the optimizer state, the schedule and
the step, so that the run can stop and start again and give the same numbers.

Generation is a different loop. The prompt is read once, and the keys and values of every layer are
stored in a cache. Then each new token computes only its own query, key and value, appends its key and
value to the cache, and reads everything that came before. The cache saves time and costs memory: two
tensors for every layer, every head, every token and every sequence in the batch. Long contexts and
large batches fill the memory with the cache, not with the weights.

Memory has a ledger. There are the weights, the gradients, the optimizer state, the saved activations
and the temporary buffers. The score matrix of explicit attention grows with the square of the length:
double the context and the matrix is four times larger. A fused kernel computes the same result in
tiles and never stores the whole matrix, so its memory grows only with the length. It does not do less
arithmetic; it moves less data.

Measure before you believe. Warm up before you time, synchronize before you read the clock, and report
the median with the batch, the length, the width, the type of the numbers and the device. A number on
a laptop is a number about that laptop. A claim about a server needs a measurement on that server.

Test before you optimize. A mask that leaks, a shift that is missing, a padding token in the loss, a
position table that is too short: each of these gives the right shapes and the wrong numbers. Write a
small test for each one. Change a future token and check that the past does not move. Change a padded
token and check that nothing moves. Save the model, load it again, and check that the outputs agree to
the last bit. Then make it fast, and check again.

The questions at the end of the day were short. Why divide by the square root of the width? Because
the dot product of two random vectors grows with the width, and large scores make the softmax too
sharp. Why the causal mask? Because at generation time the future does not exist yet. Why the cache?
Because the past does not change. Why the residual path? Because the gradient needs a road home. And
why so many small tests? Because a model that is wrong and fast is still wrong.
"""
