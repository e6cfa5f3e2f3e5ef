"""One module per lesson's exercises; ``course_utils.exercises.load(name)`` imports them all."""
