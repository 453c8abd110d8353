"""Fair-share admission (issue 4): the pure core by hand and by property, and its database layer."""
