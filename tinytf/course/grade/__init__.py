"""What an instructor runs to grade a class: ``tinytf grade`` (stock nbgrader autograde per submission, its kernel in
the bubblewrap sandbox where available), the verdicts and feedback pages, the gradebook, shards and their merge."""
