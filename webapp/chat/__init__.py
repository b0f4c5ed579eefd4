"""What end users touch: the chat page, the session, conversations, streamed answers and feedback."""
