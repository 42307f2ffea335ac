"""The one route table and its handlers (SageMaker's, KServe v2's, the multi-model API,
sessions, /metrics), the one path every inferring route takes (sagemaker.DataPlane: the
body, the answer's deadline), and the Flask app that serves the same table to other WSGI
servers.

May import: protocols/, engine/, codecs/, core/ and the base modules; not streaming/ or http/.
"""
