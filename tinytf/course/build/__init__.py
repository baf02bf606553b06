"""What a maintainer runs to build the course: the release of the exercises (nbgrader course roots), the two
editions and the words a student reads in them, the executed chapters (one cache) and the book."""
