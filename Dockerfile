FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY trajstore ./trajstore
COPY api ./api
COPY schemas ./schemas
# the service (api) and gymnasium rollouts (worker) of docker-compose.yml: the extras they run
RUN pip install --no-cache-dir '.[serve,gym]'
ENV TRAJSTORE_STORE=/data TRAJSTORE_HOST=0.0.0.0
EXPOSE 8321
CMD ["trajstore", "serve", "--store", "/data", "--create", "--host", "0.0.0.0", "--port", "8321"]
