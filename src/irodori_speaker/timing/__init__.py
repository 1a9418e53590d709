"""When each word, mora and viseme is heard: the timing estimate, spoken-to-written spans, captions."""
