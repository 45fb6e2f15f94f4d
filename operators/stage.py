"""StageOperator: a RayJobOperator whose arguments come from its stage's spec (see airflow_ray_ml.contract)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ray_ml.contract import coerce_value, field_default, params_doc, spec_fields
from airflow_ray_ml.errors import InvalidSpecError
from airflow_ray_ml.ray_job import RayJobOperator
from airflow_ray_ml_stages.specs import preprocessed_fields

if TYPE_CHECKING:
    from airflow.sdk import Context


class StageOperator(RayJobOperator):
    """Run the stage of ``spec_type`` with one keyword argument per spec field.

    Subclasses set ``spec_type`` (a ``airflow_ray_ml_stages.specs`` stage spec), ``derived_fields`` (spec fields
    the operator fills from its other arguments, such as the splits from ``data``) and
    ``own_template_fields`` (their own templated arguments); the rest follows from the spec.
    """

    spec_type: ClassVar[type]
    derived_fields: ClassVar[tuple[str, ...]] = ()
    own_template_fields: ClassVar[tuple[str, ...]] = ()
    spec_arguments: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "spec_type" not in cls.__dict__:
            return
        cls.spec_arguments = tuple(field.name for field in spec_fields(cls.spec_type, cls.derived_fields))
        cls.template_fields = (*RayJobOperator.template_fields, *cls.own_template_fields, *cls.spec_arguments)
        cls.__doc__ = (
            f"{(cls.__doc__ or '').rstrip()}\n\n    The stage's settings (``airflow_ray_ml_stages.specs.{cls.spec_type.__name__}``, "
            f"with its defaults):\n\n{params_doc(cls.spec_type, cls.spec_arguments)}\n"
        )

    def __init__(self, **kwargs: Any) -> None:
        values = {field.name: kwargs.pop(field.name) if field.name in kwargs else field_default(field)
                  for field in spec_fields(self.spec_type, self.derived_fields)}
        super().__init__(stage=self.spec_type.stage, **kwargs)
        for name, value in values.items():
            setattr(self, name, value)

    def build_spec(self, context: Context) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.spec_arguments}

    def preprocessed(self, data: Any) -> dict[str, Any]:
        """The spec's data fields from a preprocess task's XCom (``data=preprocess.output``).

        Which fields, and where each is in the XCom, the spec declares
        (``airflow_ray_ml_stages.specs.preprocessed_fields``).
        """
        needed = preprocessed_fields(self.spec_type)
        data = coerce_value(data, dict, f"{self.task_id}.data")
        if not isinstance(data, dict):
            raise InvalidSpecError(
                f"task {self.task_id!r}: data must be the preprocess task's XCom (data=preprocess.output), "
                f"got {data!r:.200}"
            )
        fields: dict[str, Any] = {}
        for name in needed:
            value: Any = data
            for key in needed[name].path:
                value = value.get(key) if isinstance(value, dict) else None
            fields[name] = value
        missing = [name for name in needed if fields[name] is None and not needed[name].optional]
        if missing:
            raise InvalidSpecError(
                f"task {self.task_id!r}: data lacks {missing} (keys {sorted(data)}); pass the preprocess task's "
                "XCom as it is (data=preprocess.output), with train and validation splits"
            )
        return fields
