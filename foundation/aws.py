"""The kinds of AWS failure, told from botocore's exception where it is at hand.

Both AWS edges use them: the S3 repository store (`agents.repo_store`) and EC2 provisioning
(`training.cloud`); the CLI picks the fix from the kind (`StoreError.reason`, `CloudError.reason`)
instead of matching message text.
"""

from __future__ import annotations

from botocore.exceptions import ClientError, NoCredentialsError

#: What to do about an "credentials" failure (`aws_failure`).
AWS_CREDENTIALS_FIX = (
    "configure AWS credentials (`aws configure`, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE=NAME)"
)


def aws_failure(err: Exception) -> str:
    """What kind of AWS failure `err` is, for the fix a caller suggests: "credentials" (none found, or
    refused), "no_bucket", or "" (anything else)."""
    code = err.response.get("Error", {}).get("Code", "") if isinstance(err, ClientError) else ""
    if isinstance(err, NoCredentialsError) or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AuthFailure"):
        return "credentials"
    return "no_bucket" if code == "NoSuchBucket" else ""
