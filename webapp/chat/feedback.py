"""The chat API's feedback writes: the shared upsert of webapp.core.feedback (one row per user and
answer), under the name the chat feature has always imported it by."""
from webapp.core.feedback import save_feedback

__all__ = ["save_feedback"]
