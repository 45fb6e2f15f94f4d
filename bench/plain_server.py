"""The baseline for bench_serve.py: the same model and validation behind plain FastAPI + uvicorn.

Run: ``python bench/plain_server.py MODEL_DIR PORT``
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]


def make_app(model_dir: str):
    from typing import Any

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    from airflow_ray_ml_stages.serve import MAX_INSTANCES, LoadedModel

    model = LoadedModel.load(model_dir)
    app = FastAPI()

    class PredictRequest(BaseModel):
        instances: list[dict[str, Any] | list[Any]] = Field(min_length=1, max_length=MAX_INSTANCES)

    @app.post("/predict")
    async def predict(body: PredictRequest):
        frame, errors = model.validate(body.instances)
        if errors:
            return JSONResponse({"detail": errors}, status_code=422)
        return {"predictions": model.predict_frame(frame).tolist(), "model_version": model.version}

    return app


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(make_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
