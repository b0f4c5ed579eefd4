"""rlhf.data.redaction: e-mail addresses and phone numbers go, ordinary numbers stay."""
from __future__ import annotations

import time

import pytest

from rlhf.data.records import ComparisonRecord, ConversationRecord, FeedbackRecord, MessageRecord
from rlhf.data.redaction import EMAIL_TOKEN, PHONE_TOKEN, redact_records, redact_text, redact_value

PHONES = [
    # international, with + or 00 and a country code
    "+44 20 7946 0958", "+44 (0) 20 7946 0958", "+1 (555) 123-4567", "+1-555-123-4567", "+1 555 123 4567",
    "+33 1 23 45 67 89", "+49 (30) 1234 5678", "+4915112345678", "+91 98765 43210", "+81-3-1234-5678",
    "+61 2 9876 5432", "+86 138 0013 8000", "+55 11 91234-5678", "+7 495 123-45-67", "+353 1 234 5678",
    "+33.1.23.45.67.89", "0044 20 7946 0958", "0049 30 12345678",
    # North American
    "(555) 123-4567", "(555)123-4567", "555-123-4567", "555.123.4567", "555 123 4567",
    # national with a trunk 0
    "020 7946 0958", "07700 900123", "07700900123", "06 12 34 56 78", "06.12.34.56.78", "030-12345678",
    "0800 123 456",
]

EMAILS = [
    "john@example.com", "USER@EXAMPLE.ORG", "first.last@example.com",
    "john.doe+newsletter@gmail.com",  # plus tag
    "first.last+tag@mail.sub.example.co.uk",  # plus tag and subdomains
    "a_b-c%d@x-y.io", "x@a.b.c.d.example", "o'neil@example.com".replace("'", ""),
]

ORDINARY = [
    "In 2024 I paid $1,299.99 for it.",  # year, price
    "It cost 1299 dollars, or 0,99 EUR each; 1,000,000 people agree.",
    "Upgrade to 1.12.0, v2.3.4 or 2024.10.1 today.",  # versions
    "Meet at 12:30, or 09:15:00 at the latest.",  # times
    "On 2024-01-15, 15/01/2024 or 15.01.2024.",  # dates
    "Server 192.168.1.1, 10.0.0.1 and 255.255.255.0.",  # IP addresses
    "Add 2 cups, bake 20 minutes at 180 degrees for 4 people.",
    "Numbers 10 20 30 40 50 60, scores 2019 2020 2021 2022, 100 200 3000 items.",
    "Between 1999-2024 we grew 3.5%; pi is 3.14159265358979.",
    "Order 1234567890123 shipped at 1700000000.",  # bare digit runs: ids, timestamps
    "Zip 02139, 0.5 liters, agent 007, ISBN 978-3-16-148410-0.",
    "Room 101-202-3030, tel 12345.",
    "Write to me at the office; the @ sign and user@localhost are not addresses.",
]


@pytest.mark.parametrize("phone", PHONES)
def test_phone_numbers_are_redacted(phone):
    assert redact_text(f"Call me on {phone}, thanks.") == f"Call me on {PHONE_TOKEN}, thanks."
    assert redact_text(phone) == PHONE_TOKEN
    assert redact_text(f"({phone})") == f"({PHONE_TOKEN})"


@pytest.mark.parametrize("email", EMAILS)
def test_email_addresses_are_redacted(email):
    assert redact_text(f"Mail <{email}> or {email}.") == f"Mail <{EMAIL_TOKEN}> or {EMAIL_TOKEN}."
    assert redact_text(f"mailto:{email}") == f"mailto:{EMAIL_TOKEN}"


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_numbers_and_text_are_kept(text):
    assert redact_text(text) == text


def test_labels_and_punctuation_around_numbers():
    for text in ("tel:+44 20 7946 0958", "Phone:555-123-4567", "phone/fax: 020 7946 0958", "[07700 900123]",
                 "\"+1 555 123 4567\""):
        assert "[PHONE]" in redact_text(text) and not any(c.isdigit() for c in redact_text(text)), text
    assert redact_text("Email:ann@example.com;bob@example.org") == f"Email:{EMAIL_TOKEN};{EMAIL_TOKEN}"


def test_several_in_one_text():
    text = ("I'm Jane (jane.doe+work@corp.example.com), call +44 20 7946 0958 or 555-123-4567 "
            "before 17:30 on 2024-03-01; the plan costs $49.99 in version 2.1.0.")
    assert redact_text(text) == (f"I'm Jane ({EMAIL_TOKEN}), call {PHONE_TOKEN} or {PHONE_TOKEN} "
                                 "before 17:30 on 2024-03-01; the plan costs $49.99 in version 2.1.0.")


def test_empty_and_none_like_values():
    assert redact_text("") == ""
    assert redact_value(None) is None
    assert redact_value(3) == 3 and redact_value(True) is True and redact_value(0.5) == 0.5


def test_redact_value_walks_nested_rows_and_keeps_keys():
    row = {"prompt": [{"role": "user", "content": "I am bob@example.com"}],
           "chosen": [{"role": "assistant", "content": "Call +1 555 123 4567"}],
           "margin": 1.0, "label": True, "split": "train", "tags": ("x@y.example.org", 2024),
           "bob@example.com": "key kept"}
    out = redact_value(row)
    assert out == {"prompt": [{"role": "user", "content": f"I am {EMAIL_TOKEN}"}],
                   "chosen": [{"role": "assistant", "content": f"Call {PHONE_TOKEN}"}],
                   "margin": 1.0, "label": True, "split": "train", "tags": (EMAIL_TOKEN, 2024),
                   "bob@example.com": "key kept"}
    assert row["prompt"][0]["content"] == "I am bob@example.com"  # the input is not changed


def test_redact_records_covers_contents_corrections_and_comments():
    fb = FeedbackRecord(thumb="down", rating=2, correction="Write to help@shop.example.com",
                        comment="my number is 07700 900123", reasons=("wrong",))
    conv = ConversationRecord(
        id=7, user_id=3, comparisons=(ComparisonRecord(1, 1, 2, 2, "a"),),
        messages=(MessageRecord(1, "user", "I'm ann@example.com, +33 1 23 45 67 89"),
                  MessageRecord(2, "assistant", "Call 555-123-4567 at 9:30 in 2024", parent_id=1, feedback=fb,
                                model_version="v1-base")))
    [out] = redact_records([conv])
    assert out.id == 7 and out.user_id == 3 and out.comparisons == conv.comparisons
    user, answer = out.messages
    assert user.content == f"I'm {EMAIL_TOKEN}, {PHONE_TOKEN}"
    assert answer.content == f"Call {PHONE_TOKEN} at 9:30 in 2024"
    assert (answer.id, answer.parent_id, answer.model_version) == (2, 1, "v1-base")
    assert answer.feedback == FeedbackRecord(thumb="down", rating=2, correction=f"Write to {EMAIL_TOKEN}",
                                             comment=f"my number is {PHONE_TOKEN}", reasons=("wrong",))
    assert redact_records([]) == []


def test_no_catastrophic_backtracking():
    start = time.perf_counter()
    for text in ["+1" + "9" * 5000, "0" + "1 " * 5000, "+1 " + "12 " * 5000 + "x", "5" * 10000,
                 "0" + "12-" * 3000, "a@" * 5000 + "b", "x@" + "a" * 20000 + "!", ("x" * 30 + "@") * 500]:
        redact_text(text)
    assert time.perf_counter() - start < 2.0
