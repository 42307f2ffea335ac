"""A small boto3 tool: local image -> ECR -> SageMaker model, endpoint and transform job.

Run it as `python -m deploy <command>`; `python -m deploy --help` lists the commands.
"""
