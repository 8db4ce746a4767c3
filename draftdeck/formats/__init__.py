"""Reading and writing chat data: readers, detection, the canonical Conversation, writers."""
