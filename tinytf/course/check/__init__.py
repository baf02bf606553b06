"""What a student runs to check an exercise: the self-check (the last cell, in the kernel) and ``tinytf validate``
(a fresh kernel through nbclient); one report, one set of released tests, the same words."""
