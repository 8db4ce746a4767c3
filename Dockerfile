FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY draftdeck draftdeck
COPY app app
COPY workers workers
COPY templates templates
COPY static static
COPY migrations migrations
COPY alembic.ini ./
RUN pip install --no-cache-dir -e .
ENV DRAFTDECK_HOME=/data/var DRAFTDECK_DATA_ROOTS=/data
EXPOSE 8000
CMD ["draftdeck", "web", "--host", "0.0.0.0", "--port", "8000"]
