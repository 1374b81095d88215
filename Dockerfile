# The Astraeus server: API, console and Dramatiq workers from one image.
# The console is built with Node in a stage of its own; the image serves its dist/.
FROM node:20-slim AS console
WORKDIR /src
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY frontend ./
# the build's type check reads the Grafana dashboard (src/grafana.test.ts: ../../deploy/…)
COPY deploy/grafana/dashboards /deploy/grafana/dashboards
RUN npm run build

FROM python:3.11-slim AS server
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /opt/astraeus
COPY pyproject.toml README.md alembic.ini schema.graphql ./
# the one `astraeus` package: the server imports the agent's backoff and address checks, and
# its CLI holds `astraeus agent` (tests/test_images.py starts the image from these lines)
COPY backend ./backend
COPY agent ./agent
COPY alembic ./alembic
COPY proto ./proto
COPY --from=console /src/dist ./frontend/dist
RUN pip install --no-cache-dir 'grpcio-tools>=1.66' && mkdir -p gen \
    && python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen \
       proto/astraeus/agent/v1/agent.proto \
    && touch gen/astraeus/__init__.py gen/astraeus/agent/__init__.py gen/astraeus/agent/v1/__init__.py \
    && pip install --no-cache-dir -e . && useradd --system --home /var/lib/astraeus astraeus \
    && mkdir -p /var/lib/astraeus && chown astraeus /var/lib/astraeus
USER astraeus
ENV ASTRAEUS_DATA_DIR=/var/lib/astraeus ASTRAEUS_HOST=0.0.0.0 ASTRAEUS_PORT=8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz')"
CMD ["astraeus", "serve"]
